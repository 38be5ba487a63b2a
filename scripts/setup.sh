#!/usr/bin/env bash
# Create .venv, install torch, build sol_ext against it with everything the program, the tests, the lint
# and the documentation site use (the extras `train` and `dev` of setup.py).
#
#   TORCH_SPEC   which torch to install (default: torch==2.14.1, a CUDA 13.0 build)
#   TORCHVISION_SPEC  the torchvision that matches it, for the VGG16-BN encoder (default:
#                torchvision==0.29.1; "" to skip)
#   PYTHON       interpreter for the environment (default: python3)
#   The CUDA kernels are compiled when a GPU is visible; SOL_EXT_FORCE_CUDA=1 compiles them without
#   one too, SOL_EXT_CPU_ONLY=1 never. TORCH_CUDA_ARCH_LIST, MAX_JOBS: see setup.py
set -euo pipefail
cd "$(dirname "$0")/.."

"${PYTHON:-python3}" -m venv .venv
.venv/bin/python -m pip install -q "${TORCH_SPEC:-torch==2.14.1}"
# What the build itself needs: --no-build-isolation below uses these and .venv's torch as they are. (Plain
# `pip install -e .` finds the same torch through build_backend/, in an isolated build environment.)
.venv/bin/python -m pip install -q setuptools wheel ninja numpy
MAX_JOBS="${MAX_JOBS:-2}" .venv/bin/python -m pip install -q --no-build-isolation -e ".[dev]"
TORCHVISION_SPEC=${TORCHVISION_SPEC-torchvision==0.29.1}
if [ -n "$TORCHVISION_SPEC" ]; then
  # --no-deps: torchvision pins one torch; never let it replace the one chosen above. (After the
  # extras: its own dependencies, numpy and pillow, are there by then.)
  .venv/bin/python -m pip install -q --no-deps "$TORCHVISION_SPEC"
fi
.venv/bin/python -c "import sol_ext; print('sol_ext ready: CUDA kernels compiled:', sol_ext.cuda_kernels_available())"
