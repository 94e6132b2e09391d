"""Run the notebooks top to bottom at the test suite's scale and store their outputs in them.

    python notebooks/render.py                     # every notebook
    python notebooks/render.py quickstart.ipynb    # some of them

Each notebook runs in a fresh kernel of this interpreter (nbclient), in notebooks/, with the
environment ``tests/test_notebook.py`` runs it with (``SCALE``: FLJAX_NOTEBOOK_ROUNDS and the like,
so a few rounds, seconds to minutes on a CPU) and the tests' XLA build (``tests/xla_build.py``), and
is written back with its outputs, figures included. The test executes each notebook once and checks
that its outputs are the stored ones (``differences``): after a change that moves a notebook's
output, run this again and commit the notebooks.

The files are stable from one rendering to the next: no timestamps or timings in the metadata, the
cells keep their ids, streams are merged, and no path of this machine is stored. Text printed from
a clock (the notebooks print how long their runs took) does change; the test ignores it.
FLJAX_RENDER_DPI sets the figures' resolution (default: matplotlib's, 100 dpi).

The training notebooks' results at their own defaults (tens of rounds, several seeds) are not these:
run a notebook by hand for them. The report notebook reads the checked-in results either way.
"""

from __future__ import annotations

import copy
import math
import os
import pathlib
import re
import sys
import tempfile

NOTEBOOKS = pathlib.Path(__file__).resolve().parent
ROOT = NOTEBOOKS.parent
COMMAND = "python notebooks/render.py"
STALE = f"stale notebook outputs: run {COMMAND}"

# Each notebook's environment at the tests' scale (tests/test_notebook.py runs it with the same).
SCALE = {
    "quickstart.ipynb": {"FLJAX_NOTEBOOK_ROUNDS": "3"},
    "new_algorithm.ipynb": {"FLJAX_NOTEBOOK_ROUNDS": "4"},
    "feddyn_as_init_analysis.ipynb": {"FLJAX_NOTEBOOK_ROUNDS": "2", "FLJAX_NOTEBOOK_SEEDS": "1"},
    "reproduction.ipynb": {"FLJAX_NOTEBOOK_ROUNDS": "1"},
}
INLINE = "module://matplotlib_inline.backend_inline"   # figures become PNG outputs


def xla_build():
    """tests/xla_build.py: the XLA flag the test processes and their notebook kernels run with."""
    sys.path.insert(0, str(ROOT))
    try:
        from tests import xla_build
    finally:
        sys.path.remove(str(ROOT))
    return xla_build


def environment(folder: pathlib.Path, scale: dict[str, str]) -> dict[str, str]:
    """The environment to start a notebook's kernel in: a 'python3' kernelspec that runs this
    interpreter (installed under ``folder``, found before any other), the notebook's ``scale``,
    inline figures, JAX on the CPU unless JAX_PLATFORMS says otherwise, the tests' XLA build, and
    this checkout's fljax first on the path."""
    from ipykernel import kernelspec

    folder = pathlib.Path(folder)
    kernelspec.install(prefix=str(folder / "jupyter"), kernel_name="python3")
    (folder / "mpl").mkdir(exist_ok=True)
    if os.environ.get("FLJAX_RENDER_DPI"):
        (folder / "mpl" / "matplotlibrc").write_text(
            f"figure.dpi: {float(os.environ['FLJAX_RENDER_DPI'])}\n")
    return {"JUPYTER_PATH": str(folder / "jupyter" / "share" / "jupyter"),
            "JUPYTER_RUNTIME_DIR": str(folder / "runtime"),
            "JUPYTER_PLATFORM_DIRS": "1",
            "MPLBACKEND": INLINE,
            "MPLCONFIGDIR": str(folder / "mpl"),
            "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
            "XLA_FLAGS": xla_build().xla_flags(os.environ.get("XLA_FLAGS", "")),
            "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get(
                "PYTHONPATH")])]),
            **scale}


def execute(nb, timeout: int = 300):
    """Run every cell of ``nb`` in place (in notebooks/, as a reader's Jupyter would); raises
    nbclient's CellExecutionError if a cell fails."""
    import nbclient

    nbclient.NotebookClient(nb, kernel_name="python3", timeout=timeout, record_timing=False,
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return nb


# -- what is stored ---------------------------------------------------------------------------

PROGRESS = re.compile(r"\r|\d+it/s|\|[#█▏▎▍▌▋▊▉ ]*\|")     # a progress bar's redraws


def private_paths() -> list[str]:
    """Folders of this machine that may show in an output, longest first."""
    found = {str(ROOT), str(pathlib.Path(sys.prefix)), str(pathlib.Path.home()),
             tempfile.gettempdir(), os.path.realpath(tempfile.gettempdir())}
    return sorted((p for p in found if len(p) > 1), key=len, reverse=True)


KERNEL_FILE = re.compile(r"\S*ipykernel_\d+[/\\]\d+\.py")     # where a cell's warning points


def scrub(text: str) -> str:
    """``text`` without this machine's folders: a cell's file (named after the kernel's process)
    becomes '<notebook cell>', the checkout '.', other folders '...'."""
    text = KERNEL_FILE.sub("<notebook cell>", text)
    for path in private_paths():
        text = text.replace(path, "." if path == str(ROOT) else "...")
    return text


def clean(nb, metadata: dict, scale: dict[str, str]):
    """``nb`` as stored: the notebook's own ``metadata`` plus what rendered it, each code cell's
    streams merged (one per stream and run of prints), no progress bars, no private paths."""
    nb.metadata = copy.deepcopy(metadata)
    nb.metadata["fljax"] = {"rendered_by": COMMAND,
                            "rendered_with_rounds": int(scale["FLJAX_NOTEBOOK_ROUNDS"]),
                            "rendered_with": dict(sorted(scale.items())),
                            "xla_flags": xla_build().FLAG}
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        outputs = []
        for out in cell.outputs:
            if out.output_type == "stream":
                if out.name == "stderr" and PROGRESS.search(out.text):
                    continue
                out.text = scrub(out.text)
                if outputs and outputs[-1].output_type == "stream" and outputs[-1].name == out.name:
                    outputs[-1].text += out.text
                    continue
            elif out.output_type in ("execute_result", "display_data"):
                for kind, value in out.get("data", {}).items():
                    if kind.startswith("text/") and isinstance(value, str):
                        out.data[kind] = scrub(value)
            elif out.output_type == "error":
                out.traceback = [scrub(line) for line in out.traceback]
            outputs.append(out)
        cell.outputs = outputs
    return nb


def render(name: str) -> pathlib.Path:
    """Run notebooks/NAME at its scale and write it back with its outputs."""
    import nbformat

    path = NOTEBOOKS / name
    nb = nbformat.read(path, as_version=4)
    metadata = copy.deepcopy(nb.metadata)
    metadata.pop("fljax", None)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    with tempfile.TemporaryDirectory() as folder:
        saved = dict(os.environ)
        os.environ.update(environment(pathlib.Path(folder), SCALE[name]))
        try:
            execute(nb)
        finally:
            os.environ.clear()
            os.environ.update(saved)
    nb = clean(nb, metadata, SCALE[name])
    nbformat.validate(nb)
    nbformat.write(nb, path)
    return path


# -- what the test compares -------------------------------------------------------------------

ABSOLUTE_PATH = re.compile(r"(?<![\w.])(/[\w.+-]+){2,}/?")           # /a/b, not w/o
VOLATILE = [(re.compile(r"\b\d+(\.\d+)?\s?(s|ms|min)\b"), "<duration>"),     # "12.3 s"
            (re.compile(r"\b0x[0-9a-fA-F]+\b"), "0x..."),                    # memory addresses
            (re.compile(r"\b\d+(\.\d+)? ?([kMGT]i?B)\b"), "<memory>"),          # the host's memory
            (ABSOLUTE_PATH, "<path>")]
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|\bnan\b|\binf\b")


def summary(cell) -> list[tuple[str, str]]:
    """A code cell's outputs as (kind, text): text of streams and results; an image as one
    ('image', '') whatever its pixels."""
    items = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            items.append((f"stream {out.name}", out.text))
        elif out.output_type == "error":
            items.append(("error", f"{out.ename}: {out.evalue}"))
        elif any(kind.startswith("image/") for kind in out.get("data", {})):
            items.append(("image", ""))
        else:
            items.append((out.output_type, out.get("data", {}).get("text/plain", "")))
    return items


# How far a stored number may be from a fresh run's. On the machine that rendered them the outputs
# are reproduced exactly; another CPU's XLA kernels round differently in float32, and at these tiny
# scales that can move an accuracy by one test example (1/360 of the digits test set) or a loss by
# a few per cent. The text around the numbers, the outputs' kinds and order, and the figures'
# count must still match exactly.
RTOL = 0.05


def same_number(a: str, b: str, rtol: float) -> bool:
    """Equal within ``rtol``, or one unit of the last printed digit (a last bit of float32 that
    rounds the other way)."""
    x, y = float(a), float(b)
    if x == y or (math.isnan(x) and math.isnan(y)):
        return True
    if not (math.isfinite(x) and math.isfinite(y)):
        return False
    return abs(x - y) <= max(rtol * max(abs(x), abs(y)), 1.000001 * max(map(last_digit, (a, b))))


def last_digit(number: str) -> float:
    """The value of one unit in the last printed digit of ``number``; 0 for an integer."""
    mantissa, _, exponent = number.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    if not decimals and not exponent:
        return 0.0
    return 10.0 ** (int(exponent or 0) - decimals)


def same_text(stored: str, fresh: str, rtol: float = RTOL) -> bool:
    """The same text once volatile parts are masked, its numbers equal within ``rtol``."""
    for pattern, mask in VOLATILE:
        stored, fresh = pattern.sub(mask, stored), pattern.sub(mask, fresh)
    if NUMBER.split(stored) != NUMBER.split(fresh):
        return False
    a, b = NUMBER.findall(stored), NUMBER.findall(fresh)
    return len(a) == len(b) and all(same_number(x, y, rtol) for x, y in zip(a, b))


def differences(stored, fresh, rtol: float = RTOL) -> list[str]:
    """Where the outputs of ``fresh`` (the same notebook, just executed and ``clean``ed; cells it
    has beyond the stored ones are ignored) differ from the ``stored`` ones."""
    found = []
    for index, (old, new) in enumerate(zip(stored.cells, fresh.cells)):
        if old.cell_type != "code":
            continue
        a, b = summary(old), summary(new)
        where = f"cell {index} ({old.get('id')})"
        if [kind for kind, _ in a] != [kind for kind, _ in b]:
            found.append(f"{where}: stored outputs {[k for k, _ in a]}, now {[k for k, _ in b]}")
            continue
        for (kind, x), (_, y) in zip(a, b):
            if not same_text(x, y, rtol):
                found.append(f"{where}, {kind}:\n--- stored\n{x}\n--- now\n{y}")
    return found


def main(names: list[str]) -> None:
    unknown = sorted(set(names) - set(SCALE))
    if unknown:
        raise SystemExit(f"no such notebook: {', '.join(unknown)} (known: {', '.join(SCALE)})")
    for name in names or sorted(SCALE):
        path = render(name)
        print(f"{path.relative_to(ROOT)}: {path.stat().st_size / 1e3:.0f} kB")


if __name__ == "__main__":
    main([pathlib.Path(arg).name for arg in sys.argv[1:]])
