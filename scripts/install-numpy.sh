#!/usr/bin/env bash
# Installs numpy from PyPI into a known folder (for the `fuzz --exec` example
# kernels, properties/examples/exec) and prints that folder (for PYTHONPATH).
#
#   export PYTHONPATH="$(scripts/install-numpy.sh | tail -n1)${PYTHONPATH:+:$PYTHONPATH}"
#
# Idempotent: an existing install is reused. Cost on a fresh machine: one
# ~16 MB wheel (73 MB installed), about 20 s; later runs about 2 s.
set -euo pipefail
dir="${1:-$HOME/.cache/logprobe/numpy}"
if ! PYTHONPATH="$dir" python3 -c 'import numpy' 2>/dev/null; then
    mkdir -p "$dir"
    PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --target "$dir" 'numpy>=1.26,<3' >&2
fi
PYTHONPATH="$dir" python3 -c 'import numpy' || { echo "numpy not importable from $dir" >&2; exit 1; }
echo "$dir"
