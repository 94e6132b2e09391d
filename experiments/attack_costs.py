"""What an attack costs each rule, from a Byzantine results folder: the tables of
docs/reproductions/evidence.md's attack sections.

    python experiments/attack_costs.py FOLDER ROW [--base ROW]

FOLDER holds what ``fljax sweep experiments/evidence_byzantine.json`` wrote (``runs.csv``; e.g.
``experiments/results/evidence_byzantine_fashion_mnist``); ROW is an attack row such as
``'IID sign flip'``; the base row is its split's no-attack row (``'IID no attack'``) unless
``--base`` names another. For each column, at each row's selected grid point, the final test
accuracy (%, mean ± std over seeds), and two paired differences over the seeds both rows ran
(the same split, initialization and batches): the attack's cost, attack − base in the same
column, and under the attack, RULE + bucketing − RULE; with the two-sided p of a paired t-test,
in bold where p < 0.01. Then CClip minus each column under the attack, and each column's selected
server lr with the values tried (a selection at an edge of them is marked).
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys

import scipy.stats

from fljax.runner.sweep import mean_std

BOLD_P = 0.01


def selected_accuracy(rows: list[dict]) -> dict[tuple[str, str], dict[int, float]]:
    """{(row, column): {seed: test accuracy in %}} of the selected grid points' runs, read as the
    CSV's decimals (a count over the test set: the exact accuracy). The sweep's results.md
    averages the float32 values fljax logged, so a mean that falls on a rounding tie (x.xx5) can
    differ from it by 0.01."""
    out: dict[tuple[str, str], dict[int, float]] = {}
    for line in rows:
        if line["selected"] == "1":
            out.setdefault((line["row"], line["column"]), {})[int(line["seed"])] = \
                100 * float(line["accuracy"])
    return out


def paired(a: dict[int, float] | None, b: dict[int, float] | None) -> str:
    """mean ± std of a − b over their common seeds (p of a paired t-test), bold where p < 0.01."""
    if not a or not b:
        return "-"
    seeds = sorted(a.keys() & b.keys())
    diff = [a[s] - b[s] for s in seeds]
    if statistics.stdev(diff) == 0:
        return f"{diff[0]:+.2f} ± 0.00 (every seed)"
    p = scipy.stats.ttest_rel([a[s] for s in seeds], [b[s] for s in seeds]).pvalue
    text = f"{statistics.mean(diff):+.2f} ± {statistics.stdev(diff):.2f} (p = {p:.2g})"
    return f"**{text}**" if p < BOLD_P else text


def cost_table(rows: list[dict], attack: str, base: str) -> str:
    """The markdown table: a line per column, in the folder's order."""
    accuracy = selected_accuracy(rows)
    columns = list(dict.fromkeys(line["column"] for line in rows))
    name = attack.split(" ", 1)[1]                   # 'IID sign flip' -> 'sign flip'
    short = name.split(" (")[0]                      # 'mimic (warm-up)' -> 'mimic'
    lines = [f"| rule | no attack | {name} | {short} - none | bucketing - none, under {short} |",
             "|---|---|---|---|---|"]
    for column in columns:
        under, without = accuracy.get((attack, column)), accuracy.get((base, column))
        bucketed = accuracy.get((attack, f"{column} + bucketing"))
        lines.append(f"| {column} | {mean_std(list((without or {}).values()))} | "
                     f"{mean_std(list((under or {}).values()))} | {paired(under, without)} | "
                     f"{paired(bucketed, under)} |")
    return "\n".join(lines)


def clip_and_grid(rows: list[dict], attack: str) -> str:
    """CClip − each column under the attack, and each column's selected server lr."""
    accuracy = selected_accuracy(rows)
    columns = list(dict.fromkeys(line["column"] for line in rows))
    out = [f"CClip - {c}: {paired(accuracy.get((attack, 'CClip')), accuracy.get((attack, c)))}"
           for c in columns if c != "CClip"]
    for column in columns:
        tried, chosen = set(), None
        for line in rows:
            if (line["row"], line["column"]) == (attack, column):
                setting = dict(part.split("=", 1) for part in line["setting"].split("; "))
                tried.add(float(setting["server_lr"]))
                chosen = setting if line["selected"] == "1" else chosen
        if chosen:
            lr = float(chosen["server_lr"])
            edge = " (grid edge)" if len(tried) > 1 and lr in (min(tried), max(tried)) else ""
            out.append(f"{column}: server lr {lr:g}{edge} of {sorted(tried)}"
                       + (f", tau {chosen['wrappers.robust.tau']}"
                          if "wrappers.robust.tau" in chosen else ""))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("row")
    parser.add_argument("--base", help="the row to pair with (default: the split's no attack)")
    args = parser.parse_args(argv)
    with open(f"{args.folder}/runs.csv") as f:
        rows = list(csv.DictReader(f))
    base = args.base or f"{args.row.split(' ', 1)[0]} no attack"
    present = {line["row"] for line in rows}
    for row in (args.row, base):
        if row not in present:
            print(f"attack_costs: row {row!r} is not in {args.folder}/runs.csv; its rows are "
                  f"{sorted(present)}", file=sys.stderr)
            return 2
    print(cost_table(rows, args.row, base) + "\n\n" + clip_and_grid(rows, args.row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
