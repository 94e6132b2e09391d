"""The quickstart notebook runs top to bottom (3 rounds) and reaches a final accuracy in [0, 1]."""

import json
import os
import pathlib
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
kernelspec = pytest.importorskip("ipykernel.kernelspec")

NOTEBOOK = pathlib.Path(__file__).resolve().parents[1] / "notebooks" / "quickstart.ipynb"
MARKER = "FLJAX_NOTEBOOK_RESULT "


def test_notebook_is_clean():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, "clear the outputs"


def test_notebook_runs(tmp_path, monkeypatch):
    # A 'python3' kernelspec that runs this interpreter, found before any other on JUPYTER_PATH.
    kernelspec.install(prefix=str(tmp_path / "jupyter"), kernel_name="python3")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter" / "share" / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    monkeypatch.setenv("FLJAX_NOTEBOOK_ROUNDS", "3")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))
    monkeypatch.setenv("JAX_PLATFORMS", os.environ.get("JAX_PLATFORMS", "cpu"))

    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(
        "import json, sys\n"
        f"print({MARKER!r} + json.dumps({{'executable': sys.executable, 'rounds': ROUNDS,\n"
        "    'final_accuracy': float(final_accuracy), 'test_acc': test_acc}))"))
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=120,
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()  # raises CellExecutionError if any cell fails

    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.output_type != "error", out
    text = "".join(out.get("text", "") for out in nb.cells[-1].outputs)
    assert MARKER in text, text
    result = json.loads(text.split(MARKER, 1)[1])
    assert os.path.realpath(result["executable"]) == os.path.realpath(sys.executable)
    assert result["rounds"] == 3
    acc = result["final_accuracy"]
    assert isinstance(acc, float) and 0.0 <= acc <= 1.0, acc
    assert len(result["test_acc"]) == 1  # 3 rounds with EVAL_EVERY=5: evaluated once, at the end
