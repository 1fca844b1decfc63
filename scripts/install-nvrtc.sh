#!/usr/bin/env bash
# Installs NVRTC for CUDA 13.0 from PyPI into a known folder and prints the
# folder holding libnvrtc.so.13 (for LD_LIBRARY_PATH).
#
#   scripts/install-nvrtc.sh [DIR]       # DIR defaults to $HOME/.cache/logprobe/nvrtc
#   export LD_LIBRARY_PATH="$(scripts/install-nvrtc.sh | tail -n1):$LD_LIBRARY_PATH"
#
# Pinned to 13.0: PTX from a newer NVRTC is rejected by a CUDA 13.0 driver
# (H200 with driver 580). The wheel has libnvrtc.so.13 and
# libnvrtc-builtins.so.13.0 under nvidia/cu13/lib; no headers are needed (the
# kernels include nothing). Idempotent: an existing install is reused.
set -euo pipefail
dir="${1:-$HOME/.cache/logprobe/nvrtc}"
lib="$dir/nvidia/cu13/lib"
if [[ ! -e "$lib/libnvrtc.so.13" ]]; then
    mkdir -p "$dir"
    python3 -m pip install --quiet --disable-pip-version-check --target "$dir" 'nvidia-cuda-nvrtc==13.0.*' >&2
fi
test -e "$lib/libnvrtc.so.13" || { echo "libnvrtc.so.13 not found under $lib" >&2; exit 1; }
echo "$lib"
