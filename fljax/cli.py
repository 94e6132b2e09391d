"""Command line: ``fljax [--config FILE] [--flag VALUE ...]`` runs one experiment.

Every ExperimentConfig field is a flag (``--clients-per-round 10``). Bad values exit with code 2
and a one-line message naming the value and what is allowed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from fljax.config import ExperimentConfig, load_config
from fljax.errors import FljaxError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fljax", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="JSON file of config values; flags override it")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    for field in dataclasses.fields(ExperimentConfig):
        flag = "--" + field.name.replace("_", "-")
        kinds = [t.strip() for t in field.type.split("|")]
        if "bool" in kinds:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        else:
            kind = int if "int" in kinds else float if "float" in kinds else str
            parser.add_argument(flag, type=kind, default=None,
                                metavar=kind.__name__.upper())
    return parser


def config_from_args(argv: list[str]) -> tuple[ExperimentConfig, argparse.Namespace]:
    args = _parser().parse_args(argv)
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


def main(argv: list[str] | None = None) -> int:
    from fljax.train import results_table, run

    try:
        config, args = config_from_args(sys.argv[1:] if argv is None else argv)
        evaluations = run(config, progress=not args.quiet)
    except FljaxError as e:
        print(f"fljax: error: {e}", file=sys.stderr)
        return 2
    print(results_table(evaluations, f"{config.algorithm} on {config.dataset}, "
                        f"{config.partition} split over {config.num_clients} clients, "
                        f"{config.clients_per_round} per round; log: {config.out_dir}/metrics.jsonl"))
    return 0
