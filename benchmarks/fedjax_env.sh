#!/usr/bin/env bash
# Build the separate Python environment that benchmarks/fedjax_round.py runs in: FedJAX needs
# jax 0.4.30 and dm-haiku 0.0.12, which cannot live beside fljax's jax.
#
#     bash benchmarks/fedjax_env.sh [ENV_DIR]      (default: build/fedjax-venv)
#
# benchmarks/peers.py looks for the environment at build/fedjax-venv (or --fedjax-env).
set -euo pipefail

env_dir="${1:-build/fedjax-venv}"
python="${PYTHON:-python3.11}"

"$python" -m venv "$env_dir"
"$env_dir/bin/pip" install --quiet --upgrade pip
# numpy < 2 and the optax/chex releases of mid-2024: the ones jax 0.4.30 and haiku 0.0.12 were
# released against (later optax/chex need a newer jax).
"$env_dir/bin/pip" install --quiet \
    "jax==0.4.30" "jaxlib==0.4.30" "dm-haiku==0.0.12" "fedjax==0.0.16" \
    "optax==0.2.3" "chex==0.1.86" "numpy<2" "scipy<1.14"
"$env_dir/bin/python" -c "import fedjax; from importlib.metadata import version; \
print(', '.join(f'{p} {version(p)}' for p in ('fedjax', 'jax', 'jaxlib', 'dm-haiku')))"
