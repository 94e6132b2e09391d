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
    from fljax.runner.config import ALGORITHMS, GROUPS, ExperimentConfig

    parser = _Parser(
        prog="fljax", description="Run one federated experiment; the same command again resumes "
        "it. Other commands: fljax algorithms [NAME] (the algorithms and their hyperparameters), "
        "fljax plot --help, fljax sweep --help.",
        epilog=f"algorithms: {', '.join(ALGORITHMS)}; or your own, by import path "
               f"(--algorithm package.module:factory) or registered (fljax.register_algorithm)")
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
    from fljax.runner.config import ExperimentConfig, load_config
    from fljax.runner.train import import_recorded

    args = _run_parser().parse_args(argv)
    fields = {f.name for f in dataclasses.fields(ExperimentConfig)}
    given = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    config = load_config(args.config, **given) if args.config else ExperimentConfig().replace(
        **given)
    grid = args.seeds is not None or bool(args.set)
    import_recorded(config.run_dir(), depth=2 if grid else 0)   # a resume of registered names
    return config.validate(), args


# One line per algorithm and wrapper for ``fljax algorithms``, in the command line's terms: its
# hyperparameters are --algorithm-args (or --wrappers) keys, the shared settings are flags. (The
# factories' docstrings speak Python; ``fljax algorithms NAME`` shows them.)
SUMMARIES = {
    "fedavg": "FedAvg: local SGD (--lr ...), then --server-optimizer with --server-lr on the "
              "averaged update (default plain SGD, server lr 1).",
    "fedsgd": "FedSGD: each client sends its full-batch gradient; the server takes a step of "
              "--lr on their weighted sum.",
    "fedprox": "FedProx: local SGD with the proximal term mu/2 ||y - w||^2.",
    "scaffold": "SCAFFOLD: local SGD corrected by control variates (server c, client c_i); "
                "option picks how c_i is updated (I, II, or GA: FedGA code's full gradients).",
    "feddyn": "FedDyn (official code): local SGD on the dynamically regularized loss with "
              "coefficient alpha; the server corrects the average with h.",
    "fedavgm": "FedAvg with server momentum (heavy ball, or dampened: an EMA) and --server-lr.",
    "fedadam": "FedAvg with Reddi et al.'s FedAdam server and --server-lr (FedDecorr defaults).",
    "fedyogi": "FedAvg with Reddi et al.'s FedYogi server and --server-lr (FedDecorr defaults).",
    "fedadagrad": "FedAvg with Reddi et al.'s FedAdagrad server and --server-lr (FedDecorr "
                  "defaults).",
    "fedexp": "FedExP: FedAvg's clients, an extrapolated server step from the updates' norms "
              "(eps, half: the factor 1/2; evaluate: the model scored).",
    "fednova": "FedNova: normalized averaging of local momentum SGD (--momentum is its rho), "
               "with a proximal mu.",
    "fedcm": "FedCM: local steps along the mix alpha of the loss gradient and the server's last "
             "update (client-level momentum).",
    "fedsam": "FedAvg with SAM local steps of radius rho.",
    "moon": "MOON: FedAvg whose clients add the model-contrastive term (weight mu, temperature "
            "tau) on the model's projected features.",
    "fedntd": "FedNTD: FedAvg whose clients distil the global model's not-true-class "
              "predictions (weight beta, temperature tau).",
    "feddecorr": "FedDecorr: FedAvg whose clients add beta x the decorrelation loss of the "
                 "model's features.",
    "fedinit": "FedInit: FedAvg whose clients start from the relaxed initialization w + beta "
               "(w - their last local model).",
    "fedga": "FedGA: a first exchange of full gradients, then local steps from the start "
             "displaced by beta (global - own gradient); FedAvg's server.",
    "gradalign": "GradAlign: FedGA's rule, run with --local-steps 1.",
    "lbsgd": "Large-batch SGD: FedSGD whose server step is SGD with --lr, --momentum, "
             "--weight-decay and --clip-norm.",
    "feddecay": "FedDecay: FedAvg with the local learning rate decayed by beta within each "
                "round (schedule, per step or epoch).",
    "fomaml": "FOMAML: the server steps meta_step_size along the clients' last local step.",
    "reptile": "Reptile: the server steps meta_step_size along the clients' updates.",
    "ditto": "Ditto: the global model by FedAvg; each client also trains a personal model "
             "regularized toward it (lam; personal_lr, default --lr).",
    "pfedme": "pFedMe: local steps on the Moreau envelope (lam, inner_steps at inner_lr) and "
              "server interpolation beta; users scored with their personal or the global model.",
    "fedem": "FedEM: the model becomes a mixture of num_components models; clients fit their "
             "mixture weights (E-step) and train the components.",
    "fedpaq": "FedPAQ: FedAvg with a QSGD-quantized uplink (levels, bucket_size).",
    "gradual_unfreezing": "FedBug: clients thaw the model's parameter groups (unit) one at a "
                          "time, in order (default input to output), over the first fraction "
                          "of their local steps.",
    "local_decay": "The local learning rate scaled by beta_j in the j-th local period (the "
                   "FedDecay rule over any algorithm).",
    "relaxed_init": "Clients start from w + beta (w - their last local model) (+RI).",
    "fedbn": "FedBN: every normalization layer of the model stays local to its client.",
    "compress": "The uplink compressed by a compressor (top_k or random_k with ratio, qsgd with "
                "levels, rotated_uniform with bits, scaled_sign), optionally with error "
                "feedback.",
    "dp": "User-level DP: updates clipped to clip_norm, Gaussian noise of multiplier "
          "noise_multiplier on their sum (or --target-epsilon); target_quantile turns on "
          "adaptive clipping.",
    "robust": "The cohort's updates side by side, aggregated by a robust rule (median, "
              "trimmed_mean, krum, multi_krum, bulyan, geometric_median, centered_clipping) that "
              "tolerates f Byzantine clients, after an optional pre aggregator (nnm, bucketing, "
              "arc).",
    "byzantine": "A seeded set of Byzantine clients (count, fraction or ids) sends an attack "
                 "(sign_flip, gaussian, alie, ipm, mimic, label_flip) instead of its update.",
}


def _algorithms(argv: list[str]) -> int:
    """``fljax algorithms``: every algorithm and wrapper with its one-line summary (SUMMARIES)
    and its hyperparameters and defaults;
    ``fljax algorithms NAME``: NAME's update rule (its module's docstring) and hyperparameters."""
    import inspect
    import textwrap

    from fljax import registry
    from fljax.runner.arguments import settable

    parser = _Parser(prog="fljax algorithms", description="List the algorithms and wrappers with "
                     "their hyperparameters, or show one's update rule and hyperparameters.")
    parser.add_argument("name", nargs="?", help="an algorithm or wrapper (a registered name or "
                        "an import path 'module:factory' too)")
    name = parser.parse_args(argv).name
    kind_of = {n: kind for kind in ("algorithm", "wrapper") for n in registry.names(kind)}

    def setting(p: inspect.Parameter) -> str:
        return f"{p.name} (required)" if p.default is p.empty else \
            f"{p.name}={json.dumps(p.default)}"

    if name is None:
        for title, names in ((f"Algorithms: fljax --algorithm NAME --algorithm-args "
                              f"'{{\"KEY\": VALUE}}'", registry.names("algorithm")),
                             (f"Wrappers over any algorithm: fljax --wrappers "
                              f"'{{\"NAME\": {{\"KEY\": VALUE}}}}'", registry.names("wrapper"))):
            print(title)
            for each in names:
                factory = registry.lookup(kind_of[each], each)
                summary = SUMMARIES.get(each) or " ".join(
                    (inspect.getdoc(factory) or "(no docstring)").split("\n\n")[0].split())
                lines = [summary, ", ".join(map(setting, settable(each, factory)))
                         or "(no hyperparameters)"]
                declared = registry.declared(factory)
                if declared:
                    lines.append("its paper's settings, used unless set: " + ", ".join(
                        f"--{k} {v}" for k, v in declared.items()))
                print(f"  {each}")
                for line in lines:
                    print(textwrap.fill(line, 100, initial_indent=" " * 6,
                                        subsequent_indent=" " * 6))
            print()
        print("The local optimizer (--lr, --lr-decay, --momentum, --weight-decay, --clip-norm), "
              "--server-lr and\n--server-optimizer are flags. fljax algorithms NAME: the update "
              "rule and hyperparameters of NAME.")
        return 0
    kind = kind_of.get(name, "algorithm")
    factory = registry.lookup(kind, name, known=registry.names("wrapper"))
    settings = settable(name, factory)
    flag = "--algorithm-args" if kind == "algorithm" else f"--wrappers '{{\"{name}\": {{...}}}}'"
    module_doc = inspect.getdoc(sys.modules[factory.__module__])
    if module_doc and factory.__module__.startswith("fljax."):   # one module per algorithm
        print(f"{name}: {module_doc}\n")
    print(f"{registry.path_of(factory)}: {inspect.getdoc(factory) or '(no docstring)'}\n")
    declared = registry.declared(factory)
    if kind == "algorithm":
        print("Its paper's settings, used where you set none: " + (", ".join(
            f"--{k} {v}" for k, v in declared.items()) if declared else
            "none declared (--aggregation examples)") + "\n")
    print(f"Hyperparameters ({flag}):" if settings else "No hyperparameters: the flags set it all.")
    for p in settings:
        kind = "" if p.annotation is p.empty else f": {p.annotation}"
        print(f"  {p.name}{kind}" + (" (required)" if p.default is p.empty else
                                     f" = {json.dumps(p.default)}"))
    return 0


def _plot(argv: list[str]) -> int:
    from fljax.runner.plot import plot_runs

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
    """Train the cells, those that share a program together (a sweep scale with 'hyperband' or
    'early_termination': each cell's grid points searched with early stopping); their results by
    cell. ``where``: a line saying where the runs write, printed once no run directory holds more
    rounds than asked."""
    from fljax.runner import early_termination, hyperband
    from fljax.runner import sweep
    from fljax.runner.train import check_rounds, run_many

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
    terminate = None if spec is None else sweep.early_termination_options(spec, args.scale)
    if terminate:
        return early_termination.run_terminated(cell_list, lambda cells: _run_cells(cells, args),
                                                terminate, spec.get("selection", "val_accuracy"))
    limit = None if args.batch_memory is None else int(args.batch_memory * 2**20)
    return sweep.run_sweep(
        cell_list, lambda configs: run_many(configs, progress=not args.quiet, fresh=fresh,
                                            memory_limit=limit),
        args.max_runs or len(cell_list))


def _sweep(argv: list[str]) -> int:
    import jax

    from fljax.runner import sweep
    from fljax.runner.train import RunInterrupted, import_recorded, write_file

    parser = _Parser(prog="fljax sweep", description="Run every cell of a sweep file (rows x "
                     "columns x seeds; see fljax/runner/sweep.py) and write its table of final test "
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
    parser.add_argument("--plan", action="store_true",
                        help="train nothing and read no data: estimate each compiled program's "
                             "memory, FLOPs and H100 time from the datasets' known shapes "
                             "(fljax.runner.estimate)")
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
    import_recorded(out_dir, depth=4)       # its runs' registered names, for a resume
    cell_list = sweep.cells(spec, args.scale, out_dir, seeds, **changes)
    if args.plan:
        return _plan(sweep.all_stages(spec, args.scale, out_dir, seeds, **changes), args, name)
    with _ctrl_c_exits("interrupted between runs; the finished runs are kept: run the same "
                       "command again to continue"):
        try:
            results, transferred = {}, {}

            def run_extension(more):
                print(f"extending the grid of {len(more)} runs whose selected value is at its "
                      f"edge", flush=True)
                return _run_cells(more, args, spec)

            stage = list(cell_list)
            while stage:
                results.update(_run_cells(stage, args, spec, where=out_dir))
                cell_list = sweep.extend_grids(spec, args.scale, cell_list, results,
                                               run_extension)     # the tuning rule
                stage = sweep.next_stage(spec, args.scale, out_dir, cell_list, results,
                                         transferred, seeds, **changes)   # transfer
                if stage:
                    print(f"next stage: {len(stage)} runs of {sorted({c.column for c in stage})} "
                          f"with the values they take from their source columns", flush=True)
                cell_list += stage
        except RunInterrupted as e:
            print(f"fljax: {e}", file=sys.stderr)
            return 130
        text = sweep.results_markdown(spec, results, args.scale,
                                      [c.config for c in cell_list], name)
        path = os.path.join(out_dir, args.scale or "base", "results.md")
        write_file(path, text + "\n")
        for csv_name, csv_text in zip(("runs.csv", "curves.csv"),
                                      sweep.results_csv(spec, results)):
            write_file(os.path.join(out_dir, args.scale or "base", csv_name), csv_text)
    print(text + f"\n\nwritten to {path}")
    return 0


def _plan(cell_list, args, name: str) -> int:
    """``fljax sweep FILE --plan``: the sweep's programs and their estimated costs."""
    from fljax.runner import estimate

    if args.max_runs is not None and args.max_runs < 1:
        raise FljaxError(f"--max-runs must be >= 1, got {args.max_runs}")
    with _ctrl_c_exits("interrupted; nothing was trained or written"):
        programs = estimate.plan([cell.config for cell in cell_list], args.max_runs,
                                 say=lambda text: print(text, file=sys.stderr, flush=True))
    print(f"{name} (scale: {args.scale or 'base'}): what it costs, estimated before running\n\n"
          + estimate.plan_table(cell_list, programs))
    return 0


def _run(argv: list[str]) -> int:
    from fljax.runner.multihost import is_primary
    from fljax.runner.train import RunInterrupted, newest_round, results_table, run

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
        print(results_table(evaluations, f"{config.algorithm} ({aggregation_said(config)}) on "
                            f"{config.dataset}, "
                            f"{config.partition} split over {config.num_clients} clients, "
                            f"{config.clients_per_round} per round; log: "
                            f"{config.run_dir()}/metrics.jsonl", config.target_accuracy))
    return 0


def aggregation_said(config) -> str:
    """What aggregation ran, and why: 'uniform aggregation, its paper's' when the algorithm's
    declaration chose it, 'examples aggregation' when it was set or is the default."""
    from fljax import registry

    ran = config.resolved().aggregation
    if config.aggregation is None and registry.declared(
            registry.lookup("algorithm", config.algorithm)).get("aggregation") == ran:
        return f"{ran} aggregation, its paper's"
    return f"{ran} aggregation"


def _grid(config, args) -> int:
    """``fljax --seeds 0-9 --set lr=0.05,0.1``: the run at every grid point for every seed, those
    sharing a program trained together, and a table of each point's mean +- std."""
    from fljax.runner import sweep
    from fljax.runner.train import RunInterrupted, write_file

    seeds = sweep.parse_seeds(args.seeds) if args.seeds is not None else [config.seed]
    cell_list = sweep.grid_cells(config, seeds, sweep.parse_grid(args.set))
    try:
        results = _run_cells(cell_list, args, where=f"{config.run_dir()} ({len(cell_list)} runs, "
                             f"each in {'POINT/' if args.set else ''}seed_S)")
    except RunInterrupted as e:
        print(f"fljax: {e}", file=sys.stderr)
        return 130
    with _ctrl_c_exits("interrupted after the runs finished; everything is saved"):
        text = (f"{config.algorithm} ({aggregation_said(config)}) on {config.dataset}, "
                f"{len(seeds)} seed(s) per setting; "
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
