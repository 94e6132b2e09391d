"""Command line.

    fljax [--config FILE] [--fresh] [--flag VALUE ...]   run one experiment (resumes by default)
    fljax algorithms [NAME]                              the algorithms, their hyperparameters
    fljax plot RUN_DIR [RUN_DIR ...] [--out FILE.png]    accuracy and loss curves of runs
    fljax sweep FILE [--scale cpu] [--out-dir DIR]        a paper's table: a grid of runs
    fljax --seeds 0-9 --set lr=0.05,0.1 [--flag VALUE ...] a grid of runs of one experiment

Every ExperimentConfig field is a flag (``--clients-per-round 10``). Bad values exit with code 2
and one line naming the value and what is allowed. Ctrl-C exits with code 130 and one line at any
moment: at once while nothing is being written (start-up), else after the current round, with a
checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sys
import threading

from fljax.errors import FljaxError


@contextlib.contextmanager
def _ctrl_c_exits(message: str):
    """While inside, Ctrl-C prints ``fljax: MESSAGE`` and exits with code 130 at once: no
    traceback, and nothing a half-done import or exception could leave behind. Only for spans
    that write nothing; the runner catches Ctrl-C itself while it writes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        os.write(2, f"fljax: {message}\n".encode())
        os._exit(130)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class _Parser(argparse.ArgumentParser):
    """argparse with fljax's errors: one line ``fljax: error: ...`` and exit code 2 (the usage
    is in --help)."""

    def error(self, message: str):
        raise FljaxError(message)


def _run_parser() -> argparse.ArgumentParser:
    """The flags of a run: one per ExperimentConfig field, grouped, each with its default."""
    from fljax.config import ALGORITHMS, GROUPS, ExperimentConfig

    parser = _Parser(
        prog="fljax", description="Run one federated experiment; the same command again resumes "
        "it. Other commands: fljax algorithms [NAME] (the algorithms and their hyperparameters), "
        "fljax plot --help, fljax sweep --help.",
        epilog=f"algorithms: {', '.join(ALGORITHMS)}")
    parser.add_argument("--config", metavar="FILE",
                        help="JSON file of config values, keyed by the flag names with _ "
                             "for - (clients_per_round); flags override it")
    groups = {name: parser.add_argument_group(name) for name in GROUPS}
    groups["output"].add_argument("--fresh", action="store_true",
                                  help="start over: first delete the run's checkpoints and logs "
                                       "in --out-dir (checkpoints/, damaged_checkpoints/, "
                                       "metrics.jsonl, tb/, config.json; nothing else there)")
    groups["output"].add_argument("--quiet", action="store_true", help="no progress bar")
    groups["run"].add_argument("--seeds", metavar="SEEDS",
                               help="several runs: these seeds (e.g. 0-9 or 0,3,5), each in "
                                    "OUT_DIR/seed_S, trained together in one program")
    groups["run"].add_argument("--set", action="append", default=[], metavar="KEY=V1,V2",
                               help="several runs: a grid over a config key's values (JSON; "
                                    "dotted keys reach into JSON fields, e.g. "
                                    "algorithm_args.mu=0.01,0.1), each point in OUT_DIR/POINT")
    _batch_flags(groups["run"])
    for field in dataclasses.fields(ExperimentConfig):
        flags = ["--" + field.name.replace("_", "-"), *field.metadata["aliases"]]
        text = f"{field.metadata['help']} (default: {_shown(field.default)})".replace("%", "%%")
        group = groups[field.metadata["group"]]
        kinds = [t.strip() for t in field.type.split("|")]
        if "bool" in kinds:
            group.add_argument(*flags, dest=field.name, action=argparse.BooleanOptionalAction,
                               default=None, help=text)
        else:
            kind = int if "int" in kinds else float if "float" in kinds else str
            group.add_argument(*flags, dest=field.name, type=kind, default=None,
                               metavar=kind.__name__.upper(), help=text)
    return parser


def _shown(value) -> str:
    """A default as --help shows it."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def config_from_args(argv: list[str]) -> tuple[ExperimentConfig, argparse.Namespace]:
    from fljax.config import ExperimentConfig, load_config

    args = _run_parser().parse_args(argv)
    fields = {f.name for f in dataclasses.fields(ExperimentConfig)}
    given = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    # Naming one kind of local work turns the other off.
    if "local_steps" in given and "local_epochs" not in given:
        given["local_epochs"] = None
    if "local_epochs" in given and "local_steps" not in given:
        given["local_steps"] = None
    config = load_config(args.config, **given) if args.config else ExperimentConfig().replace(
        **given)
    return config.validate(), args


def _algorithms(argv: list[str]) -> int:
    """``fljax algorithms``: every algorithm and wrapper with its hyperparameters and defaults;
    ``fljax algorithms NAME``: NAME's update rule (its module's docstring) and hyperparameters."""
    import inspect
    import textwrap

    from fljax import algorithms
    from fljax.config import ALGORITHMS, WRAPPERS
    from fljax.arguments import settable

    parser = _Parser(prog="fljax algorithms", description="List the algorithms and wrappers with "
                     "their hyperparameters, or show one's update rule and hyperparameters.")
    parser.add_argument("name", nargs="?", help="an algorithm or wrapper")
    name = parser.parse_args(argv).name

    def setting(p: inspect.Parameter) -> str:
        return f"{p.name} (required)" if p.default is p.empty else \
            f"{p.name}={json.dumps(p.default)}"

    if name is None:
        for title, names in ((f"Algorithms: fljax --algorithm NAME --algorithm-args "
                              f"'{{\"KEY\": VALUE}}'", ALGORITHMS),
                             (f"Wrappers over any algorithm: fljax --wrappers "
                              f"'{{\"NAME\": {{\"KEY\": VALUE}}}}'", WRAPPERS)):
            print(title)
            for each in names:
                doc = inspect.getdoc(getattr(algorithms, each)).split("\n\n")[0]
                lines = [" ".join(doc.split()), ", ".join(map(setting, settable(each, getattr(algorithms, each))))
                         or "(no hyperparameters)"]
                print(f"  {each}")
                for line in lines:
                    print(textwrap.fill(line, 100, initial_indent=" " * 6,
                                        subsequent_indent=" " * 6))
            print()
        print("The local optimizer (--lr, --lr-decay, --momentum, --weight-decay, --clip-norm), "
              "--server-lr and\n--server-optimizer are flags. fljax algorithms NAME: the update "
              "rule and hyperparameters of NAME.")
        return 0
    if name not in ALGORITHMS + WRAPPERS:
        raise FljaxError(f"unknown algorithm or wrapper {name!r}; choose one of "
                         f"{list(ALGORITHMS + WRAPPERS)}")
    factory = getattr(algorithms, name)
    settings = settable(name, factory)
    flag = "--algorithm-args" if name in ALGORITHMS else f"--wrappers '{{\"{name}\": {{...}}}}'"
    print(f"{name}: {sys.modules[factory.__module__].__doc__.strip()}\n")
    print(f"fljax.algorithms.{name}: {inspect.getdoc(factory)}\n")
    print(f"Hyperparameters ({flag}):" if settings else "No hyperparameters: the flags set it all.")
    for p in settings:
        kind = "" if p.annotation is p.empty else f": {p.annotation}"
        print(f"  {p.name}{kind}" + (" (required)" if p.default is p.empty else
                                     f" = {json.dumps(p.default)}"))
    return 0


def _plot(argv: list[str]) -> int:
    from fljax.plot import plot_runs

    parser = _Parser(prog="fljax plot", description="Plot test accuracy and train loss per round "
                     "of one or more run directories.")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    parser.add_argument("--out", default="fljax_plot.png", help="PNG file to write")
    parser.add_argument("--metrics", help="comma-separated metrics to draw, one panel each "
                        "(default: accuracy,train_loss), e.g. pseudo_gradient_diversity")
    args = parser.parse_args(argv)
    metrics = args.metrics.split(",") if args.metrics else None
    with _ctrl_c_exits("interrupted; no plot was written"):
        print(plot_runs(args.run_dirs, args.out, metrics))
    return 0


def _batch_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-memory", type=float, metavar="MB",
                        help="memory a program of runs trained together may take (default: 3/4 "
                             "of the accelerator's, half of the host's on CPU)")
    parser.add_argument("--max-runs", type=int, metavar="N",
                        help="at most N runs in one program (1: one run at a time)")


def _run_cells(cell_list, args, spec=None, where=None):
    """Train the cells, those that share a program together (a sweep scale with 'hyperband':
    each cell's grid points searched with early stopping); their results by cell. ``where``: a
    line saying where the runs write, printed once no run directory holds more rounds than
    asked."""
    from fljax import hyperband, sweep
    from fljax.train import check_rounds, run_many

    if args.max_runs is not None and args.max_runs < 1:
        raise FljaxError(f"--max-runs must be >= 1, got {args.max_runs}")
    if args.batch_memory is not None and args.batch_memory <= 0:
        raise FljaxError(f"--batch-memory must be > 0 (MB), got {args.batch_memory}")
    fresh = getattr(args, "fresh", False)
    if not fresh:               # before anything is trained
        check_rounds([cell.config for cell in cell_list])
    if where:
        print(f"fljax: writing to {where}", flush=True)
    options = None if spec is None else sweep.hyperband_options(spec, args.scale)
    if options:
        return hyperband.run_pruned(cell_list, lambda cells: _run_cells(cells, args), options,
                                    spec.get("selection", "val_accuracy"))
    limit = None if args.batch_memory is None else int(args.batch_memory * 2**20)
    return sweep.run_sweep(
        cell_list, lambda configs: run_many(configs, progress=not args.quiet, fresh=fresh,
                                            memory_limit=limit),
        args.max_runs or len(cell_list))


def _sweep(argv: list[str]) -> int:
    import jax

    from fljax import sweep
    from fljax.train import RunInterrupted, write_file

    parser = _Parser(prog="fljax sweep", description="Run every cell of a sweep file (rows x "
                     "columns x seeds; see fljax/sweep.py) and write its table of final test "
                     "accuracies. The cells that differ only in traced hyperparameters and "
                     "their data train together in one compiled program.")
    parser.add_argument("file")
    parser.add_argument("--scale", help="one of the file's scales (e.g. cpu, full)")
    parser.add_argument("--out-dir", help="where the runs go (default: runs/FILE_NAME)")
    parser.add_argument("--seeds", nargs="+", metavar="SEEDS",
                        help="instead of the file's seeds: integers and ranges (e.g. 0-19, or "
                             "0 3 5)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value in every run (JSON value), e.g. "
                             "--set rounds=3 --set dataset=cifar100")
    parser.add_argument("--rows", nargs="+", metavar="ROW", help="run only these rows")
    parser.add_argument("--columns", nargs="+", metavar="COLUMN",
                        help="run only these columns (and the comparisons among them)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    _batch_flags(parser)
    args = parser.parse_args(argv)
    spec = sweep.load_sweep(args.file)
    name = os.path.splitext(os.path.basename(args.file))[0]
    out_dir = args.out_dir or os.path.join("runs", name)
    if not jax.config.jax_compilation_cache_dir:
        # Seeds and settings share programs: a run loads what an earlier one compiled.
        jax.config.update("jax_compilation_cache_dir", os.path.join(out_dir, "xla_cache"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    changes = sweep.parse_settings(args.set)
    spec = sweep.restrict(spec, args.rows, args.columns)
    seeds = None if args.seeds is None else sweep.parse_seeds(",".join(args.seeds))
    cell_list = sweep.cells(spec, args.scale, out_dir, seeds, **changes)
    with _ctrl_c_exits("interrupted between runs; the finished runs are kept: run the same "
                       "command again to continue"):
        try:
            results = _run_cells(cell_list, args, spec, where=out_dir)
            for _ in range(sweep.MAX_EXTENSIONS):      # the tuning rule: no selected edge
                more = sweep.extensions(spec, cell_list, results)
                if not more:
                    break
                print(f"extending the grid of {len(more)} runs whose selected value is at its "
                      f"edge", flush=True)
                cell_list += more
                results.update(_run_cells(more, args, spec))
        except RunInterrupted as e:
            print(f"fljax: {e}", file=sys.stderr)
            return 130
        text = f"{spec.get('title', name)} (scale: {args.scale or 'base'})\n\n" + sweep.table(
            spec, results, args.scale)
        path = os.path.join(out_dir, args.scale or "base", "results.md")
        write_file(path, text + "\n")
        for csv_name, csv_text in zip(("runs.csv", "curves.csv"),
                                      sweep.results_csv(spec, results)):
            write_file(os.path.join(out_dir, args.scale or "base", csv_name), csv_text)
    print(text + f"\n\nwritten to {path}")
    return 0


def _run(argv: list[str]) -> int:
    from fljax.multihost import is_primary
    from fljax.train import RunInterrupted, newest_round, results_table, run

    config, args = config_from_args(argv)
    if args.seeds is not None or args.set:
        return _grid(config, args)
    if config.process_id == 0 and (args.fresh or
                                   newest_round(config.run_dir()) < config.rounds):
        print(f"fljax: writing to {config.run_dir()}", flush=True)
    try:
        evaluations = run(config, progress=not args.quiet, fresh=args.fresh)
    except RunInterrupted as e:
        print(f"fljax: {e}", file=sys.stderr)
        return 130
    if not is_primary():
        return 0                  # process 0 of a multi-process run prints the results
    with _ctrl_c_exits("interrupted after the run finished; everything is saved"):
        print(results_table(evaluations, f"{config.algorithm} on {config.dataset}, "
                            f"{config.partition} split over {config.num_clients} clients, "
                            f"{config.clients_per_round} per round; log: "
                            f"{config.run_dir()}/metrics.jsonl", config.target_accuracy))
    return 0


def _grid(config, args) -> int:
    """``fljax --seeds 0-9 --set lr=0.05,0.1``: the run at every grid point for every seed, those
    sharing a program trained together, and a table of each point's mean +- std."""
    from fljax import sweep
    from fljax.train import RunInterrupted, write_file

    seeds = sweep.parse_seeds(args.seeds) if args.seeds is not None else [config.seed]
    cell_list = sweep.grid_cells(config, seeds, sweep.parse_grid(args.set))
    try:
        results = _run_cells(cell_list, args, where=f"{config.run_dir()} ({len(cell_list)} runs, "
                             f"each in {'POINT/' if args.set else ''}seed_S)")
    except RunInterrupted as e:
        print(f"fljax: {e}", file=sys.stderr)
        return 130
    with _ctrl_c_exits("interrupted after the runs finished; everything is saved"):
        text = (f"{config.algorithm} on {config.dataset}, {len(seeds)} seed(s) per setting; "
                f"runs in {config.run_dir()}\n\n" + sweep.grid_table(results))
        write_file(os.path.join(config.run_dir(), "results.md"), text + "\n")
        print(text)
    return 0


# The CPU devices share the host's cores: on a busy host one device's thread can reach a
# collective long after the other's, and XLA aborts the process after 40 s by default.
CPU_COLLECTIVE_TIMEOUT = "--xla_cpu_collective_call_terminate_timeout_seconds=86400"


def _cpu_devices_for_runs() -> None:
    """Runs trained together are spread over the devices: on a CPU host, make one XLA device per
    core (before JAX starts; nothing if it runs already or XLA_FLAGS sets a count), with a
    collective timeout of a day instead of XLA's 40 s."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "jax" in sys.modules or "xla_force_host_platform_device_count" in flags:
        return
    os.environ["XLA_FLAGS"] = (f"{flags} --xla_force_host_platform_device_count="
                               f"{os.cpu_count() or 1} {CPU_COLLECTIVE_TIMEOUT}").strip()


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv``; returns the exit code (2: bad input, 130: Ctrl-C)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sweep"] or any(a.split("=")[0] in ("--seeds", "--set") for a in argv):
        _cpu_devices_for_runs()
    with _ctrl_c_exits("interrupted during start-up; nothing was written"):
        try:
            commands = {"algorithms": _algorithms, "plot": _plot, "sweep": _sweep}
            if argv[:1] and argv[0] in commands:
                return commands[argv[0]](argv[1:])
            return _run(argv)
        except FljaxError as e:
            print(f"fljax: error: {e}", file=sys.stderr)
            return 2
