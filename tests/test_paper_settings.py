"""Every ``--scale full`` cell of every sweep is the paper's own setting, value by value.

``experiments/settings/*.md`` hold, per paper, a table of the settings the paper states, each with
the section or table it comes from:

    | sweep | scale | rows | columns | setting | value | source | quote |

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
  every algorithm, wrapper and switch argument it sets, except the values a stage takes from
  another column's selection (``transfer``), which no line may state;
- every sweep file with a full scale has a table, and every line has a source;
- every line has a quote: the words its value comes from, so a reader checks the line against the
  paper without searching it. ``quote`` is one or more quoted passages, each with an optional label
  before it: none for the paper the table is for, ``code OWNER/REPO/PATH`` for a line of the official
  code, any other label (``McMahan et al. 2017``) for another paper. A line whose value the paper and
  its code do not state says so with ``ours: <why>`` instead. ``...`` inside a passage marks words
  left out. Where ``FLJAX_PAPER_TEXT`` names a folder holding a paper's text as ``<table>.txt``
  (the settings table's name with .txt for .md), each unlabelled passage must occur in it word
  for word (compared on letters and digits only, so line breaks, hyphenation and markup do not
  matter).
"""

from __future__ import annotations

import glob
import json
import os
import re
import unicodedata

import pytest

from fljax.runner import sweep

ROOT = os.path.join(os.path.dirname(__file__), "..")
EXPERIMENTS = os.path.join(ROOT, "experiments")
TABLES = sorted(glob.glob(os.path.join(EXPERIMENTS, "settings", "*.md")))
HEADER = ["sweep", "scale", "rows", "columns", "setting", "value", "source", "quote"]
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
            assert len(fields) == len(HEADER), f"{path}: line {text!r} has not {len(HEADER)} fields"
            line = dict(zip(HEADER, fields))
            line["value"] = json.loads(line["value"].strip("`"))
            line["setting"] = line["setting"].strip("`")
            line["table"] = os.path.splitext(os.path.basename(path))[0]
            line["where"] = f"{os.path.basename(path)}: {text}"
            lines.append(line)
    return lines


PASSAGE = re.compile(r'\s*([^"]*?)\s*"([^"]+)"\s*[;+,]?')
SHORTEST_PASSAGE = 12  # letters and digits of a paper's passage: a phrase, not a bare number


def passages(quote: str) -> list[tuple[str, str]]:
    """A quote cell's (label, passage) pairs; ValueError where text lies outside a passage."""
    found, end = [], 0
    for match in PASSAGE.finditer(quote):
        if match.start() != end:
            break
        found.append((match.group(1), match.group(2)))
        end = match.end()
    if quote[end:].strip():
        raise ValueError(f"{quote[end:].strip()!r} is outside a quoted passage")
    return found


def letters(text: str) -> str:
    """Text reduced to its lower-case letters and digits (line breaks, hyphens, markup gone)."""
    return "".join(c for c in unicodedata.normalize("NFKC", text).lower() if c.isalnum())


def occurs(passage: str, text: str) -> bool:
    """Whether the passage's pieces (split at ``...``) occur in the text in order."""
    at = 0
    for piece in re.split(r"\.\.\.|\u2026", passage):
        piece = letters(piece)
        at = text.find(piece, at)
        if at < 0:
            return False
        at += len(piece)
    return True


def quote_problems(lines: list[dict], text_dir: str | None) -> list[str]:
    """Every line whose quote is missing, malformed, too short, or (where the paper's text is in
    ``text_dir``) not the paper's words."""
    problems, texts = [], {}
    for line in lines:
        quote, where = line["quote"], line["where"]
        if quote.startswith("ours:"):
            if len(quote[5:].split()) < 3:
                problems.append(f"'ours:' without a reason: {where}")
            continue
        try:
            found = passages(quote)
        except ValueError as error:
            problems.append(f"{error}: {where}")
            continue
        if not found:
            problems.append(f"a line without a quote: {where}")
        for label, passage in found:
            if label.startswith("code"):
                if not re.fullmatch(r"code [\w.-]+/[\w.-]+/\S+", label):
                    problems.append(f"{label!r} names no OWNER/REPO/PATH: {where}")
            elif len(letters(passage)) < SHORTEST_PASSAGE:
                problems.append(f"the passage {passage!r} is too short to find: {where}")
            elif not label and text_dir:
                path = os.path.join(text_dir, line["table"] + ".txt")
                if os.path.exists(path):
                    if path not in texts:
                        texts[path] = letters(open(path, encoding="utf-8").read())
                    if not occurs(passage, texts[path]):
                        problems.append(f"{passage!r} is not in {path}: {where}")
    return problems


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
    for cell in sweep.all_stages(spec, scale, out_dir, seeds=[0]):
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
                # a stage's values taken from another column (transfer) are that column's
                # selection, not settings: no line states them
                taken = set((spec["columns"][column].get("transfer") or {}).get("keys", []))
                stated = set()
                for line in mine:
                    if not (covers(line["rows"], row) and covers(line["columns"], column)):
                        continue
                    if line["setting"] in taken:
                        problems.append(f"{name} ({scale}) {row} / {column}: "
                                        f"{line['setting']} is taken from "
                                        f"{spec['columns'][column]['transfer']['from']!r}'s "
                                        f"selection, not stated ({line['where']})")
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
                missing = sorted(needed - stated - taken)
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


def test_every_line_quotes_where_its_value_comes_from():
    problems = quote_problems(parse_tables(TABLES), os.environ.get("FLJAX_PAPER_TEXT"))
    assert not problems, f"{len(problems)} lines:\n" + "\n".join(problems)


@pytest.mark.parametrize("quote, problem", [
    ('"we train 500 rounds on cifar"', None),
    ('"we train 500 ... on CIFAR-10" + code owner/repo/main.py "lr = 0.1 # local"', None),
    ('ours: no paper states it', None),
    ("", "a line without a quote"),
    ("§5: 500 rounds", "outside a quoted passage"),
    ('"500 rounds"', "too short"),
    ('"we train 800 rounds on cifar"', "is not in"),
    ('"on CIFAR-10 ... we train 500"', "is not in"),
    ('code main.py "lr = 0.1 # local"', "names no OWNER/REPO/PATH"),
    ("ours: none", "without a reason"),
], ids=["words", "gap and code", "ours", "none", "unquoted", "short", "misquote", "order",
        "code without repo", "ours without reason"])
def test_a_missing_or_wrong_quote_fails_the_check(quote, problem, tmp_path):
    (tmp_path / "paper.txt").write_text("... We train 500\nrounds on CIFAR-\n10 to achieve ...")
    line = {"quote": quote, "where": "paper.md: a line", "table": "paper"}
    problems = quote_problems([line], str(tmp_path))
    assert (problems == []) if problem is None else (len(problems) == 1 and problem in problems[0])
