"""benchmarks/gpu.py: its --smoke run writes every step's rows with numbers; without a GPU and
without --smoke it refuses in one line."""

import os
import re
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "gpu.py")
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}

# Each step's title in the report, and the labels of its rows at the smoke scale (cohort 4,
# 3 local steps, im2col conv and client_chunk 1 by default on CPU).
ROWS = {
    "1. Setups (a) and (b)": [
        "fljax, im2col conv, client_chunk=1 (sequential) [default]",
        "fljax, im2col conv, client_chunk=4 (vmap all)",
        "fljax, xla conv, client_chunk=1 (sequential)",
        "limit: one lax.scan of 12 SGD steps (im2col conv)"],
    "2. The pfl-research CIFAR-10 setup (b)": ["fljax defaults (im2col conv, client_chunk=1)"],
    "3. Clients vmapped, sequential, chunked": [
        "client_chunk=1 (sequential) [default]", "client_chunk=2 (2 chunks)",
        "client_chunk=4 (vmap all)", "limit: one lax.scan"],
    "4. Per-client convolutions": ["xla conv", "im2col conv", "limit: one lax.scan"],
    "5. Unrolled local steps": ["unroll=1 [default]", "unroll=2", "unroll=3 (all local steps)",
                                "limit: one lax.scan"],
    "6. bfloat16 compute": ["float32 [default]", "bfloat16 compute, float32 parameters",
                            "limit: one lax.scan"],
    "7. Many runs in one program": ["1", "2"],
    # Rows only where pfl-research's environment has a CUDA PyTorch; else one line says why.
    "8. fljax vs pfl-research": [],
    "9. Calibration": ["VGG-11", "ResNet-20", "ConvNet2", "Tiny CNN"],
}
NUMBER = r"\d[\d,]*\.?\d*x?"


def parts(text: str) -> dict[str, str]:
    """The report's ``### title`` parts: {title: text}."""
    return dict(re.findall(r"^### ([^\n]+)\n(.*?)(?=^### |\Z)", text, re.M | re.S))


def test_smoke_run_writes_every_step_with_numbers(tmp_path):
    out = tmp_path / "B.md"
    done = subprocess.run([sys.executable, SCRIPT, "--smoke", "--out", str(out)], env=ENV,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = out.read_text()
    assert text.startswith("# Benchmarks\n\n## GPU rows (`benchmarks/gpu.py`)\n")
    found = parts(text)
    assert len(found) == len(ROWS)
    for start, labels in ROWS.items():
        (body,) = [body for title, body in found.items() if title.startswith(start)]
        assert "Machine: " in body and "Run: smoke" in body
        rows = [line for line in body.splitlines() if line.startswith("| ")][1:]   # no header
        cells = [[cell.strip() for cell in row.strip("| ").split(" | ")] for row in rows]
        for label in labels:   # in step 1, setups (a) and (b) each have the row
            matches = [row for row in cells if any(c.startswith(label) for c in row[:2])]
            assert matches, (start, label)
            for row in matches:
                assert sum(bool(re.fullmatch(NUMBER, c)) for c in row) >= 3, row
    (runs,) = [body for title, body in found.items() if title.startswith("7. ")]
    assert ("Target (batched runs): >= 5x the run-rounds/s of R = 1 at some R >= 64: not "
            "measured (no R >= 64 in this run).") in runs
    check_calibration(next(body for title, body in found.items() if title.startswith("9. ")))


def check_calibration(body: str) -> None:
    """The calibrate step's table: a row per family whose measured / estimated is the ratio of
    its measured and estimated s/round (as printed), each a positive number."""
    lines = [line for line in body.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("| ").split(" | ")]
    assert header[-3:] == ["measured s/round", "estimated s/round", "measured / estimated"]
    rows = [[cell.strip() for cell in line.strip("| ").split(" | ")]
            for line in lines[1:]]   # after the header ('|---|' does not start with '| ')
    assert [row[0].split(",")[0] for row in rows] == ["VGG-11", "ResNet-20", "ConvNet2",
                                                      "Tiny CNN"]
    for row in rows:
        measured, estimated, ratio = row[-3:]
        assert re.fullmatch(r"\d+\.\d{4,}", measured), row
        assert re.fullmatch(r"\d+\.\d{4,}", estimated), row
        assert re.fullmatch(r"\d[\d,]*\.\d{2}x", ratio), row
        measured, estimated = float(measured), float(estimated)
        assert measured > 0 and estimated > 0, row
        # each printed to >= 3 significant digits; the ratio to 2 decimals
        ratio = float(ratio[:-1].replace(",", ""))
        assert abs(ratio - measured / estimated) <= 0.005 + 0.02 * measured / estimated, row


def test_without_a_gpu_it_refuses_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, SCRIPT, "--out", str(tmp_path / "B.md")], env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == ("gpu.py: needs a GPU (jax's backend here is cpu); --smoke "
                                   "--out FILE runs a tiny version anywhere")
    assert not (tmp_path / "B.md").exists()
