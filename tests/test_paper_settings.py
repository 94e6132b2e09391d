"""Every ``--scale full`` cell of every sweep is the paper's own setting, value by value.

``experiments/settings/*.md`` hold, per paper, a table of the settings the paper states, each with
the section or table it comes from:

    | sweep | scale | rows | columns | setting | value | source |

``sweep`` names a file of ``experiments/`` (without .json), ``scale`` one of its full scales,
``rows`` / ``columns`` the cells the line covers (``*`` for all, else names joined by `` & ``),
``setting`` a config field (a dotted path reaches into a JSON field: ``algorithm_args.alpha``,
``wrappers.gradual_unfreezing.fraction``) and ``value`` its JSON value. A cell's value is the set
of values its runs take over its grid and seeds: one value, or the sorted list its grid searches
(``[0.05, 0.1, 0.2, 0.4]``). The test resolves every full-scale cell through ``fljax.runner.sweep.cells``
(the same merge of base, scale, row and column a run gets) and checks that

- each line's value is the value of every cell it covers (so a merge rule or a config default can
  never silently change a cell: earlier reviews of the settings found four such cases);
- every cell has a line for each setting a paper states: data, split and its parameter, clients,
  participation, local work, batch, lr and its decay, weight decay, rounds, model, algorithm, and
  every algorithm, wrapper and switch argument it sets;
- every sweep file with a full scale has a table, and every line has a source.
"""

from __future__ import annotations

import glob
import json
import os

import pytest

from fljax.runner import sweep

ROOT = os.path.join(os.path.dirname(__file__), "..")
EXPERIMENTS = os.path.join(ROOT, "experiments")
TABLES = sorted(glob.glob(os.path.join(EXPERIMENTS, "settings", "*.md")))
HEADER = ["sweep", "scale", "rows", "columns", "setting", "value", "source"]
REQUIRED = ("dataset", "model", "partition", "num_clients", "clients_per_round", "participation",
            "batch_size", "lr", "lr_decay", "weight_decay", "rounds", "algorithm")
PARTITION_PARAMETER = {"dirichlet": "dirichlet_alpha", "dirichlet_balanced": "dirichlet_alpha",
                       "classes": "classes_per_client"}
JSON_FIELDS = ("algorithm_args", "switch_args", "wrappers")


def parse_tables(paths: list[str]) -> list[dict]:
    """The lines of every settings table, each a dict of HEADER plus where it was read."""
    lines = []
    for path in paths:
        with open(path) as f:
            rows = [line.strip() for line in f if line.strip().startswith("|")]
        for i, text in enumerate(rows):
            fields = [cell.strip() for cell in text.strip("|").split("|")]
            if [f.lower() for f in fields] == HEADER or set(text) <= set("|- "):
                continue
            assert len(fields) == len(HEADER), f"{path}: line {text!r} has not 7 fields"
            line = dict(zip(HEADER, fields))
            line["value"] = json.loads(line["value"].strip("`"))
            line["setting"] = line["setting"].strip("`")
            line["where"] = f"{os.path.basename(path)}: {text}"
            lines.append(line)
    return lines


def full_scales(spec: dict) -> list[str]:
    return [scale for scale in spec.get("scales", {}) if scale.startswith("full")]


def value_of(config, setting: str):
    """A config field, or a dotted path into one of its JSON fields (KeyError where unset)."""
    field, *path = setting.split(".")
    value = getattr(config, field)
    if path:
        value = json.loads(value) if isinstance(value, str) else value
        for part in path:
            value = value[part]
    return value


def json_leaves(config) -> list[str]:
    """The dotted paths of every argument a cell's algorithm, switch and wrappers set."""
    leaves = []

    def walk(prefix, node):
        if isinstance(node, dict) and node:
            for key, child in node.items():
                walk(f"{prefix}.{key}", child)
        elif not isinstance(node, dict):
            leaves.append(prefix)

    for field in JSON_FIELDS:
        value = getattr(config, field)
        walk(field, json.loads(value) if isinstance(value, str) else (value or {}))
    return leaves


def groups(spec: dict, scale: str, out_dir: str) -> dict[tuple, list]:
    """Each (row, column) of the sweep at ``scale``: its runs' configs."""
    result: dict[tuple, list] = {}
    for cell in sweep.cells(spec, scale, out_dir, seeds=[0]):
        result.setdefault((cell.row, cell.column), []).append(cell.config)
    return result


def covers(pattern: str, name: str) -> bool:
    return pattern == "*" or name in [p.strip() for p in pattern.split("&")]


def check(specs: dict[str, dict], lines: list[dict], out_dir: str) -> list[str]:
    """Every disagreement between the sweeps (name -> spec) and the table lines, as messages."""
    problems = []
    for name, spec in specs.items():
        for scale in full_scales(spec):
            mine = [line for line in lines if (line["sweep"], line["scale"]) == (name, scale)]
            for (row, column), configs in groups(spec, scale, out_dir).items():
                stated = set()
                for line in mine:
                    if not (covers(line["rows"], row) and covers(line["columns"], column)):
                        continue
                    stated.add(line["setting"])
                    try:
                        values = sorted({json.dumps(value_of(c, line["setting"]), sort_keys=True)
                                         for c in configs})
                    except KeyError:
                        problems.append(f"{name} ({scale}) {row} / {column}: "
                                        f"{line['setting']} is not set ({line['where']})")
                        continue
                    actual = [json.loads(v) for v in values]
                    actual = actual[0] if len(actual) == 1 else sorted(actual)
                    if actual != line["value"]:
                        problems.append(f"{name} ({scale}) {row} / {column}: {line['setting']} "
                                        f"is {actual!r}, the table says {line['value']!r} "
                                        f"({line['where']})")
                config = configs[0]
                needed = set(REQUIRED) | set(json_leaves(config))
                needed.add("local_steps" if config.local_steps is not None else "local_epochs")
                if config.partition in PARTITION_PARAMETER:
                    needed.add(PARTITION_PARAMETER[config.partition])
                if config.switch_to:
                    needed |= {"switch_to", "switch_at"}
                missing = sorted(needed - stated)
                if missing:
                    problems.append(f"{name} ({scale}) {row} / {column}: no table line states "
                                    f"{missing}")
    for line in lines:
        if not line["source"]:
            problems.append(f"a line without a source: {line['where']}")
        if line["sweep"] not in specs or line["scale"] not in full_scales(specs[line["sweep"]]):
            problems.append(f"no full scale {line['scale']!r} of a sweep {line['sweep']!r}: "
                            f"{line['where']}")
    return problems


def load_specs() -> dict[str, dict]:
    return {os.path.splitext(os.path.basename(p))[0]: sweep.load_sweep(p)
            for p in sorted(glob.glob(os.path.join(EXPERIMENTS, "*.json")))
            if "rows" in json.load(open(p))}


def test_every_full_scale_cell_is_the_papers_setting(tmp_path):
    specs = load_specs()
    lines = parse_tables(TABLES)
    unlisted = sorted(name for name, spec in specs.items()
                      if full_scales(spec) and name not in {line["sweep"] for line in lines})
    assert not unlisted, f"sweeps with a full scale but no settings table: {unlisted}"
    problems = check(specs, lines, str(tmp_path))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("change", [
    ("evidence_feddyn_init", ("scales", "full", "base", "dirichlet_alpha"), 0.3),
    ("evidence_fedga", ("scales", "full", "FedGA", "grid", "lr"), [0.1, 0.2]),
    ("evidence_fedbug", ("scales", "full", "base", "local_epochs"), 10),
    ("evidence_fedinit", ("scales", "full", "FedDyn"), {}),
], ids=["N1 alpha", "N3 grid", "N2 epochs", "N4 decay"])
def test_a_changed_value_fails_the_check(change, tmp_path):
    """The audit's N1-N4, put back one at a time, are each caught."""
    name, path, value = change
    specs = load_specs()
    spec = json.loads(json.dumps(specs[name]))
    node = spec
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    lines = [line for line in parse_tables(TABLES) if line["sweep"] == name]
    assert not check({name: specs[name]}, lines, str(tmp_path))
    assert check({name: spec}, lines, str(tmp_path))
