"""The notebooks run top to bottom at tiny scale (FLJAX_NOTEBOOK_ROUNDS), report their results, and
are stored with the outputs of that run (``python notebooks/render.py`` writes them)."""

import copy
import importlib.util
import json
import os
import pathlib
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
kernelspec = pytest.importorskip("ipykernel.kernelspec")

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
MARKER = "FLJAX_NOTEBOOK_RESULT "


def load_render():
    spec = importlib.util.spec_from_file_location("fljax_notebooks_render", NOTEBOOKS / "render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render = load_render()


def execute(name: str, tmp_path, monkeypatch, rounds: int, report: str, **env) -> dict:
    """Run notebooks/NAME with ROUNDS rounds (and ``env``) plus a last cell printing ``report`` (a
    Python expression over the notebook's names) as JSON; check that the notebook's stored outputs
    are this run's (render.py renders it with the same environment); return the report."""
    scale = {"FLJAX_NOTEBOOK_ROUNDS": str(rounds), **env}
    assert scale == render.SCALE[name], "render.py's SCALE runs the notebook as this test does"
    # A 'python3' kernelspec that runs this interpreter, found before any other on JUPYTER_PATH.
    for key, value in render.environment(tmp_path, scale).items():
        monkeypatch.setenv(key, value)

    stored = nbformat.read(NOTEBOOKS / name, as_version=4)
    nb = copy.deepcopy(stored)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.cells.append(nbformat.v4.new_code_cell(
        f"import json, sys\nprint({MARKER!r} + json.dumps({{'executable': sys.executable, "
        f"'report': {report}}}))"))
    render.execute(nb)  # raises CellExecutionError if any cell fails

    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.output_type != "error", out
    text = "".join(out.get("text", "") for out in nb.cells[-1].outputs)
    assert MARKER in text, text
    result = json.loads(text.split(MARKER, 1)[1])
    assert os.path.realpath(result["executable"]) == os.path.realpath(sys.executable)

    stale = render.differences(stored, render.clean(nb, stored.metadata, scale))
    if stored.metadata.get("fljax", {}).get("rendered_with") != scale:
        stale.insert(0, f"rendered with {stored.metadata.get('fljax', {}).get('rendered_with')}, "
                        f"run with {scale}")
    assert not stale, "\n".join([render.STALE, *stale])
    return result["report"]


@pytest.mark.parametrize("name", sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")))
def test_notebook_is_rendered(name):
    """Stored with the outputs of a run, top to bottom, that raised nothing and printed no path of
    the machine that ran it; whether they are the current code's outputs, the tests that run the
    notebooks check."""
    cells = json.loads((NOTEBOOKS / name).read_text())["cells"]
    assert all("id" in cell for cell in cells), "every cell needs an id (nbformat.validator.normalize)"
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    assert name in render.SCALE, "render.py renders every notebook"
    assert nb.metadata.get("fljax", {}).get("rendered_with") == render.SCALE[name], render.STALE
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1)), render.STALE
    assert any(cell.outputs for cell in code), render.STALE
    private = render.private_paths()
    for cell in code:
        assert "execution" not in cell.metadata          # no timestamps
        for kind, text in render.summary(cell):
            assert kind != "error", (cell.id, text)
            assert not any(path in text for path in private), (cell.id, text)
            assert not render.ABSOLUTE_PATH.search(text), (cell.id, text)


def test_quickstart_runs(tmp_path, monkeypatch):
    report = execute("quickstart.ipynb", tmp_path, monkeypatch, rounds=3,
                     report="{'rounds': ROUNDS, 'final_accuracy': float(final_accuracy), "
                            "'test_acc': test_acc, 'grid': grid_accuracy.tolist(), "
                            "'grid_programs': grid_round.compilations()}")
    assert report["rounds"] == 3
    acc = report["final_accuracy"]
    assert isinstance(acc, float) and 0.0 <= acc <= 1.0, acc
    assert len(report["test_acc"]) == 1  # 3 rounds with EVAL_EVERY=5: evaluated once, at the end
    grid = report["grid"]                 # 3 lrs x 5 seeds, one program
    assert len(grid) == 3 and all(len(row) == 5 and all(0 <= a <= 1 for a in row) for row in grid)
    assert report["grid_programs"] == 1


def test_new_algorithm_notebook_checks_its_algorithm_against_fedavg(tmp_path, monkeypatch):
    """The notebook's own asserts ran (else execution fails); its numbers are reported here."""
    report = execute("new_algorithm.ipynb", tmp_path, monkeypatch, rounds=4,
                     report="{'unbound': difference_unbound, 'small': difference_small, "
                            "'step': largest_clipped_step, 'clip': SMALL_CLIP, "
                            "'runs': list(results)}")
    assert report["unbound"] <= 1e-6
    assert report["step"] <= report["clip"] * (1 + 1e-5)
    assert report["small"] > 1e-3
    assert len(report["runs"]) == 3


def test_feddyn_as_init_analysis_notebook_measures_every_figure(tmp_path, monkeypatch):
    """At 2 rounds and 1 seed: every figure's runs happen and give finite measurements (the
    verdicts in its markdown come from the full run, 60 rounds and 3 seeds)."""
    report = execute("feddyn_as_init_analysis.ipynb", tmp_path, monkeypatch, rounds=2,
                     FLJAX_NOTEBOOK_SEEDS="1",
                     report="{'fig1': {k: [float(r['pseudo_gradient_diversity'][-1]), "
                            "float(r['cosine_to_last'][0]), r['accuracy'][ROUNDS]] "
                            "for k, v in fig1.items() for r in v}, "
                            "'drift': {k: [v['local_drift_diversity'][0], "
                            "v['pseudo_gradient_diversity'][0]] for k, v in drift.items()}, "
                            "'clusters': {k: v[0.5] for k, v in clusters.items()}}")
    assert sorted(report["fig1"]) == sorted(["FedAvg", "FedDyn", "SCAFFOLD", "FedNTD", "MOON",
                                             "FedDyn->FedAvg"])
    for diversity, cosine, accuracy in report["fig1"].values():
        assert diversity > 0 and -1 <= cosine <= 1 and 0 <= accuracy <= 1
    assert len(report["drift"]) == 6
    assert all(v > 0 for pair in report["drift"].values() for v in pair)
    assert all(20 <= c[0] <= 240 for c in report["clusters"].values())


def test_reproduction_report_recomputes_every_claim_from_the_checked_in_results(tmp_path,
                                                                                monkeypatch):
    """The report notebook runs on the checked-in results; every claim it reports (a paired
    difference and its verdict) is recomputed here from the CSV files: the selected runs of the
    two columns, paired by seed, a paired t-test (one-sided against the margin for a 'matches'
    claim), and the verdict rule."""
    import csv
    import gzip

    import numpy as np
    import scipy.stats

    from fljax.runner import sweep

    results = NOTEBOOKS.parent / "experiments" / "results"
    measured = sorted(p.name for p in results.glob("*") if (p / "runs.csv").exists())
    assert measured, "no checked-in results under experiments/results"
    report = execute("reproduction.ipynb", tmp_path, monkeypatch, rounds=1, report="CLAIMS")
    assert {c["sweep"] for c in report} == set(measured)     # every measured sweep is read
    for c in report:
        name = c["sweep"]
        rows = [r for r in csv.DictReader(open(results / name / "runs.csv"))
                if r["row"] == c["row"] and r["selected"] == "1"]

        def values(column):
            mine = sorted((r for r in rows if r["column"] == column), key=lambda r: int(r["seed"]))
            scale = 100 if "acc" in c["key"] else 1
            return [scale * float(r[c["key"]]) for r in mine]

        a, b = values(c["a"]), values(c["b"])
        assert len(a) == len(b) == c["n"] >= 2
        diff = np.subtract(a, b)
        np.testing.assert_allclose(c["mean"], diff.mean(), rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(c["std"], diff.std(ddof=1), rtol=1e-9, atol=1e-9)
        if c.get("margin") is not None:      # 'a matches b': non-inferiority at the margin
            p = scipy.stats.ttest_rel(np.add(a, c["margin"]), b, alternative="greater").pvalue
            expected = "reproduced" if p < 0.05 else "not reproduced"
        else:
            p = scipy.stats.ttest_rel(a, b).pvalue
            expected = ("reproduced" if p < 0.05 and np.sign(diff.mean()) == c["sign"] else
                        "not reproduced")
        np.testing.assert_allclose(c["p"], p, rtol=1e-9)
        assert c["verdict"] == expected, c
        path = results / name / "curves.csv"      # a large one is checked in gzipped
        curves = list(csv.DictReader(open(path) if path.exists() else gzip.open(f"{path}.gz", "rt")))
        key = next((k for k in ("val_accuracy", "existing_val_acc") if k in curves[0]), None)
        for column, shown in zip((c["a"], c["b"]), c["rising"]):   # the rule's point 5
            gains = []
            for seed in sorted({r["seed"] for r in curves if r["row"] == c["row"]
                                and r["column"] == column}):
                evals = [{"round": int(r["round"]), "diverged": r["diverged"] == "1",
                          **({key: float(r[key])} if key and r[key] else {})}
                         for r in curves if (r["row"], r["column"], r["seed"]) ==
                         (c["row"], column, seed)]
                gain = sweep.late_gain(evals, key) if key else None
                if gain is not None:
                    gains.append(100 * gain)
            assert shown == (pytest.approx(float(np.mean(gains))) if gains else None), c


INSTALLING = ("quickstart.ipynb", "new_algorithm.ipynb", "feddyn_as_init_analysis.ipynb")


def install_cell(name: str) -> str:
    cells = json.loads((NOTEBOOKS / name).read_text())["cells"]
    return "".join(next(c for c in cells if c["cell_type"] == "code")["source"])


@pytest.mark.parametrize("name", INSTALLING)
def test_the_install_cell_installs_fljax_from_the_source_set_or_says_what_to_set(name,
                                                                              monkeypatch):
    """Where fljax is importable the first cell does nothing; where it is not (a fresh Colab), it
    pip-installs FLJAX_SOURCE, or stops with one line saying what to set when that is empty."""
    import importlib.util
    import subprocess

    source = install_cell(name)
    assert source == install_cell(INSTALLING[0])              # one cell, the same everywhere
    assert 'FLJAX_SOURCE = ""' in source and "github.com/fljax" not in source
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: calls.append(args[0]))
    exec(source, {})                                           # fljax importable: nothing
    assert calls == []
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda module, *a: None if module == "fljax" else find_spec(module, *a))
    with pytest.raises(SystemExit) as stop:
        exec(source, {})
    assert "set FLJAX_SOURCE" in str(stop.value) and "\n" not in str(stop.value)
    assert calls == []
    url = "git+https://example.org/me/fljax@main"
    exec(source.replace('FLJAX_SOURCE = ""', f"FLJAX_SOURCE = {url!r}"), {})
    assert calls == [[sys.executable, "-m", "pip", "install", "-q", url]]
