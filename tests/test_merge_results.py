"""experiments/merge_results.py: result folders of one sweep, merged, give what one call of
``fljax sweep`` over all their runs writes; a run that differs between folders, or a selection
whose curves no folder holds, stops it with one line (exit 2). Nothing trains here: the checked-in
FedGA results are split and merged back."""

import csv
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).parents[1]
SWEEP = ROOT / "experiments" / "evidence_fedga.json"
WHOLE = ROOT / "experiments" / "results" / "evidence_fedga_2000"


def load_merge():
    spec = importlib.util.spec_from_file_location(
        "merge_results", ROOT / "experiments" / "merge_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_part(folder, keep):
    """A folder with the lines of WHOLE's two CSVs for which ``keep(line)`` holds."""
    folder.mkdir()
    for name in ("runs.csv", "curves.csv"):
        with open(WHOLE / name) as f:
            lines = list(csv.reader(f))
        with open(folder / name, "w", newline="") as f:
            csv.writer(f, lineterminator="\n").writerows([lines[0]] + [
                line for line in lines[1:] if keep(dict(zip(lines[0], line)))])


def test_columns_run_apart_merge_into_the_table_of_one_call(tmp_path):
    merge = load_merge()
    write_part(tmp_path / "a", lambda r: r["column"] in ("FedAvg", "FedGA"))
    write_part(tmp_path / "b", lambda r: r["column"] not in ("FedAvg", "FedGA")
               or r["setting"] == "lr=0.2")      # FedAvg's selected runs again, in both folders
    assert merge.main([str(SWEEP), str(tmp_path / "b"), str(tmp_path / "a"),
                       "--out", str(tmp_path / "out")]) == 0
    for name in ("runs.csv", "curves.csv"):
        whole = sorted((WHOLE / name).read_text().splitlines())
        assert sorted((tmp_path / "out" / name).read_text().splitlines()) == whole
    table = (tmp_path / "out" / "results.md").read_text()
    assert "| one class per client: selected on val_accuracy | lr=0.2 | lr=0.02 | lr=0.05 | " \
           "lr=0.2, beta=0.1" in table      # beta 0.1: the top of the beta these runs tried
    assert "| FedGA - FedAvg | -2.67 ± 2.46 (p = 0.0075, n = 10) |" in table


def test_a_run_with_other_numbers_in_another_folder_stops_the_merge(tmp_path, capsys):
    merge = load_merge()
    write_part(tmp_path / "a", lambda r: True)
    write_part(tmp_path / "b", lambda r: r["column"] == "FedAvg" and r["seed"] == "3")
    runs = (tmp_path / "b" / "runs.csv").read_text().splitlines()
    changed = [line if i != 1 else line[:-1] + ("1" if line[-1] != "1" else "2")
               for i, line in enumerate(runs)]
    (tmp_path / "b" / "runs.csv").write_text("\n".join(changed) + "\n")
    assert merge.main([str(SWEEP), str(tmp_path / "a"), str(tmp_path / "b"),
                       "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "not the same run" in error and "'FedAvg'" in error
    assert not (tmp_path / "out").exists()


def test_a_selection_whose_curves_no_folder_holds_stops_the_merge(tmp_path, capsys):
    merge = load_merge()
    write_part(tmp_path / "a", lambda r: not (r["column"] == "FedGA" and r["selected"] == "1"))
    assert merge.main([str(SWEEP), str(tmp_path / "a"), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "has no curves" in error and "'FedGA'" in error


@pytest.mark.parametrize("text, expected", [
    ("lr=0.2; algorithm_args.beta=0.1", (("lr", 0.2), ("algorithm_args.beta", 0.1))),
    ("", ()), ("order=top_down", (("order", "top_down"),))])
def test_settings_read_back_as_the_sweep_wrote_them(text, expected):
    assert load_merge().parse_setting(text) == expected


def test_rows_run_apart_merge_with_a_gzipped_curves_file(tmp_path):
    """Two rows of the checked-in Fashion-MNIST Byzantine table (its curves.csv.gz), split into
    a plain folder and a gzipped one, merge back into the same selections, test accuracies and
    paired differences (6-digit numbers read back as float32, as logged); only the validation
    gain of the last quarter may move by 0.01."""
    import gzip

    merge = load_merge()
    whole = ROOT / "experiments" / "results" / "evidence_byzantine_fashion_mnist"
    rows = {"a": "IID no attack", "b": "non-IID label flip"}
    for folder, row in rows.items():
        (tmp_path / folder).mkdir()
        for name in ("runs.csv", "curves.csv"):
            opened = open(whole / name) if name == "runs.csv" else gzip.open(
                whole / (name + ".gz"), "rt")
            with opened as f:
                lines = f.read().splitlines()
            text = "\n".join([lines[0]] + [line for line in lines[1:]
                                           if line.startswith(row + ",")]) + "\n"
            if folder == "b" and name == "curves.csv":
                with gzip.open(tmp_path / folder / (name + ".gz"), "wt") as f:
                    f.write(text)
            else:
                (tmp_path / folder / name).write_text(text)
    sweep_file = ROOT / "experiments" / "evidence_byzantine.json"
    assert merge.main([str(sweep_file), str(tmp_path / "a"), str(tmp_path / "b"), "--out",
                       str(tmp_path / "out"), "--scale", "fashion_mnist",
                       "--rows", *rows.values()]) == 0
    merged = (tmp_path / "out" / "results.md").read_text().splitlines()
    checked_in = (whole / "results.md").read_text().splitlines()
    for row in rows.values():
        ours = [line for line in merged if line.startswith(f"| {row}")]
        theirs = [line for line in checked_in if line.startswith(f"| {row}")]
        assert len(ours) == 3 and [line for line in ours if "gain" not in line] == \
            [line for line in theirs if "gain" not in line]

    def differences(lines):        # {(pair, row): its paired difference}
        header = next(line for line in lines if line.startswith("| paired difference"))
        names = [name.strip(" |") for name in header.split(" | ")[1:]]
        return {(cells[0].strip("| "), name): value.strip(" |") for line in lines
                if " - " in line.split(" | ")[0] and line.startswith("| ")
                for cells in [line.split(" | ")] for name, value in zip(names, cells[1:])}

    ours, theirs = differences(merged), differences(checked_in)
    assert len(ours) == 2 * 11 and all(ours[key] == theirs[key] for key in ours)
