#!/usr/bin/env bash
# The two set-up commands of README.md, runnable on a fresh machine:
#   scripts/run.sh verify   verify the shipped PyTorch dumps (the main job)
#   scripts/run.sh test     the test gate (cargo test over the workspace)
# Each first installs what a fresh machine lacks: m4 (GMP's build needs it)
# and a C++17 compiler (the tests build the CUDA kernels for the host,
# feature `cuda-host` of logprobe-kernels).
set -euo pipefail
cd "$(dirname "$0")/.."

ensure_build_deps() {
    local missing=()
    command -v m4 >/dev/null 2>&1 || missing+=(m4)
    if ! command -v "${CXX:-c++}" >/dev/null 2>&1 && ! command -v g++ >/dev/null 2>&1 \
        && ! command -v clang++ >/dev/null 2>&1; then
        missing+=(g++)
    fi
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "installing ${missing[*]} (m4 builds GMP for the MPFR oracle; g++ builds the host CUDA kernels)..." >&2
        if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
        $SUDO apt-get update -qq >/dev/null
        $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

cmd="${1:-}"
shift || true
case "$cmd" in
    verify)
        ensure_build_deps
        exec cargo run --release --quiet -p logprobe-properties --bin logprobe -- \
            verify --expect fixtures/torch/expected.json fixtures/torch/*.safetensors "$@"
        ;;
    test)
        ensure_build_deps
        exec cargo test --workspace "$@"
        ;;
    deps)
        ensure_build_deps
        ;;
    *)
        echo "usage: scripts/run.sh verify|test|deps [extra args]" >&2
        exit 2
        ;;
esac
