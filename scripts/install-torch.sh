#!/usr/bin/env bash
# Installs PyTorch from PyPI into a known folder (for the Python package's
# torch tests, properties/python/tests/test_*torch*.py, and the docs'
# examples) and prints that folder (for PYTHONPATH).
#
#   export PYTHONPATH="$(scripts/install-torch.sh | tail -n1)${PYTHONPATH:+:$PYTHONPATH}"
#
# PyPI's Linux wheel of torch is the CUDA build: it needs the CUDA runtime
# packages it depends on to import at all, even on a machine without a GPU
# (the tests run on the CPU). Cost, measured on the 2-core CI machine
# (docs/build.md): about 3 GB downloaded and 5.4 GB installed, 82 s wall
# with the torch wheel in pip's cache; later runs reuse the folder (2-3 s to
# import-check). Idempotent.
set -euo pipefail
dir="${1:-$HOME/.cache/logprobe/torch}"
version="2.15.0"
check() { PYTHONPATH="$dir" python3 -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$version')" 2>/dev/null; }
if ! check; then
    rm -rf "$dir"
    mkdir -p "$dir"
    PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check \
        --target "$dir" "torch==$version" >&2
fi
check || { echo "torch $version not importable from $dir" >&2; exit 1; }
echo "$dir"
