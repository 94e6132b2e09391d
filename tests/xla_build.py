"""The tests' XLA build (see conftest.py) and a way to check a claim in the default build."""

import os
import subprocess
import sys

FLAG = "--xla_backend_optimization_level=0"     # set for the test processes by conftest.py


def xla_flags(flags: str = "") -> str:
    """XLA_FLAGS for a test process or a child that sets its own: ``flags`` and the tests' FLAG."""
    return flags if FLAG in flags else f"{flags} {FLAG}".strip()


def in_default_build(module: str, function: str) -> None:
    """Call ``module.function()`` (a test's assertions) in a child Python process whose XLA has
    its default optimization level; its failure fails the caller with the child's error."""
    flags = os.environ.get("XLA_FLAGS", "").replace(FLAG, "").strip()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", f"import {module}; {module}.{function}()"],
                          env={**os.environ, "XLA_FLAGS": flags}, cwd=root, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
