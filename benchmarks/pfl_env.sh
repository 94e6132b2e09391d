#!/usr/bin/env bash
# Build the separate Python environment that benchmarks/pfl_round.py runs in: pfl-research 0.6.0
# pins dp-accounting < 0.6 (fljax needs a newer one) and runs its simulations on PyTorch, which
# fljax does not depend on.
#
#     bash benchmarks/pfl_env.sh [ENV_DIR]      (default: build/pfl-venv)
#
# benchmarks/peers.py looks for the environment at build/pfl-venv (or --pfl-env).  Set
# TORCH_INDEX=https://download.pytorch.org/whl/cu121 (say) to install a CUDA build of PyTorch
# for benchmarks/gpu.py's peers step; by default the CPU build is installed, from PyTorch's own
# index when it can be reached and from PyPI otherwise.
set -euo pipefail

env_dir="${1:-build/pfl-venv}"
python="${PYTHON:-python3.11}"
torch_index="${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"

"$python" -m venv "$env_dir"
"$env_dir/bin/pip" install --quiet --upgrade pip
# --retries 0: an index that cannot be reached fails at once instead of after minutes of retries.
if ! "$env_dir/bin/pip" install --quiet --retries 0 --timeout 30 torch --index-url "$torch_index"; then
    echo "pfl_env.sh: torch from $torch_index failed; installing it from PyPI" >&2
    "$env_dir/bin/pip" install --quiet torch
fi
"$env_dir/bin/pip" install --quiet "pfl[pytorch]==0.6.0"
"$env_dir/bin/python" -c "import pfl, torch; from importlib.metadata import version; \
print(', '.join(f'{p} {version(p)}' for p in ('pfl', 'torch', 'numpy', 'dp-accounting')))"
