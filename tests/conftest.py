"""Test-session settings: one persistent XLA compilation cache for the test processes.

Many tests build the same round program more than once (a rerun for determinism, a resumed run, a
CLI subprocess); with the cache the later builds load the compiled program instead of compiling
it again. Results are unchanged: the same program is loaded.
"""

import os
import tempfile

import jax

CACHE = os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                              os.path.join(tempfile.gettempdir(), "fljax-tests-xla-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
jax.config.update("jax_compilation_cache_dir", CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

