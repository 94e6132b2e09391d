"""Test-session settings: one persistent XLA compilation cache for the test processes, and XLA's
backend (LLVM) optimization off.

Many tests build the same round program more than once (a rerun for determinism, a resumed run, a
CLI subprocess); with the cache the later builds load the compiled program instead of compiling
it again. Results are unchanged: the same program is loaded.

At the tests' tiny scales compiling costs more than running: ``--xla_backend_optimization_level=0``
skips LLVM's optimization of the compiled kernels (XLA's HLO passes, fusion included, still run)
and cuts a cold compile by about a third. float32 results can differ from a default build's in the
last bit (e.g. a multiply-add LLVM would contract), so no test compares with numbers stored from
another build: every tolerance against a float64 reference and every bit-identity (resume, a batch
against its runs alone, a rerun) is between programs of this one build. Child processes (the CLI,
a notebook's kernel) inherit the flag through the environment; benchmarks and users' runs keep
XLA's default. A claim that two different programs agree bit for bit is a claim about the build
users run: ``in_default_build`` checks it in a child process with XLA's default flags.
"""

import os
import tempfile

from tests.xla_build import xla_flags

os.environ["XLA_FLAGS"] = xla_flags(os.environ.get("XLA_FLAGS", ""))   # before jax starts

import jax  # noqa: E402

CACHE = os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                              os.path.join(tempfile.gettempdir(), "fljax-tests-xla-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
jax.config.update("jax_compilation_cache_dir", CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

