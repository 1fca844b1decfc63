#!/usr/bin/env bash
# The two set-up commands of README.md, runnable on a fresh machine:
#   scripts/run.sh verify   verify the shipped PyTorch dumps (the main job)
#   scripts/run.sh test     the test gate (cargo test over the workspace)
# Each first installs what a fresh machine lacks: m4 (GMP's build needs it).
set -euo pipefail
cd "$(dirname "$0")/.."

ensure_build_deps() {
    if ! command -v m4 >/dev/null 2>&1; then
        echo "installing m4 (needed to build GMP for the MPFR oracle)..." >&2
        if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
        $SUDO apt-get update -qq >/dev/null
        $SUDO apt-get install -y -qq m4 >/dev/null
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
