#!/usr/bin/env bash
# The two set-up commands of README.md, runnable on a fresh machine:
#   scripts/run.sh verify   verify the shipped PyTorch dumps (the main job)
#   scripts/run.sh test     the test gate: cargo test --workspace --release
# and, for CI (not a set-up command: the wheel's release build costs minutes):
#   scripts/run.sh python   build the Python package's wheel and sdist
#                           (scripts/build-wheel.sh: manylinux_2_34 abi3,
#                           twine check, CPU-baseline scan) into target/wheels
#                           with the workspace's compiled crates, install the
#                           wheel into a fresh venv and run its pytest suite
#                           (numpy, ml_dtypes; torch tests skip unless torch
#                           is installed there)
# All three build in the release profile with .cargo/config.toml's flags, so
# the second command reuses what the first compiled (docs/build.md).
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

# python3 with venv + pip (Debian splits venv out as python3-venv).
ensure_python() {
    if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
        echo "installing python3-venv (the Python package's tests run in a venv)..." >&2
        if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
        $SUDO apt-get update -qq >/dev/null
        $SUDO apt-get install -y -qq python3 python3-venv >/dev/null
    fi
}

python_suite() {
    ensure_build_deps
    ensure_python
    local venv="${LOGPROBE_VENV:-target/python-venv}"
    case "$venv" in /*) ;; *) venv="$PWD/$venv" ;; esac
    local t0 t1 t2 wheel
    t0=$(date +%s)
    # The release artifacts, as a user downloads them: an abi3 manylinux
    # wheel and an sdist, checked (twine, the CPU-baseline scan), compiled into
    # the workspace's target/ so the crates the test build compiled are reused
    # (the wheel's lock agrees with Cargo.lock: scripts/check-locks.py).
    wheel="$(bash scripts/build-wheel.sh | tail -n1)"
    t1=$(date +%s)
    # A fresh venv installs the built wheel: no Rust, no compiler involved.
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check --no-index "$wheel"
    t2=$(date +%s)
    echo "python: wheel built in $((t1 - t0)) s; fresh venv + wheel install in $((t2 - t1)) s" >&2
    "$venv/bin/pip" install -q --disable-pip-version-check pytest numpy ml_dtypes safetensors
    # The installed wheel needs no Rust: import and verify with a PATH that
    # holds no cargo / rustc (and a CARGO_HOME / RUSTUP_HOME that does not exist).
    env -i HOME=/nonexistent PATH=/usr/bin:/bin CARGO_HOME=/nonexistent RUSTUP_HOME=/nonexistent \
        "$venv/bin/python" -c '
import shutil, logprobe
assert shutil.which("cargo") is None and shutil.which("rustc") is None
import numpy as np
logits = np.array([[0.0, 1.0, 2.0]], dtype=np.float32)
r = logprobe.verify(logits, np.array([2]), log_probs=np.array([-0.40760596444438013], dtype=np.float32))
assert r.ok, str(r)
print("python: the installed wheel verifies without Rust:", r.verdict)
'
    # With LOGPROBE_TORCH_DIR (scripts/install-torch.sh's folder; CI sets it)
    # the torch tests and the docs' torch examples run and must not skip.
    if [[ -n "${LOGPROBE_TORCH_DIR:-}" ]]; then
        (cd properties/python && PYTHONPATH="$LOGPROBE_TORCH_DIR" LOGPROBE_REQUIRE_TORCH=1 \
            "$venv/bin/python" -m pytest -q tests "$@")
    else
        (cd properties/python && "$venv/bin/python" -m pytest -q tests "$@")
    fi
}

cmd="${1:-}"
shift || true
case "$cmd" in
    verify)
        ensure_build_deps
        exec cargo run --release --quiet -p logprobe-cli --bin logprobe -- \
            verify --expect fixtures/torch/expected.json fixtures/torch/*.safetensors "$@"
        ;;
    test)
        ensure_build_deps
        exec cargo test --workspace --release "$@"
        ;;
    python)
        python_suite "$@"
        ;;
    deps)
        ensure_build_deps
        ;;
    *)
        echo "usage: scripts/run.sh verify|test|python|deps [extra args]" >&2
        exit 2
        ;;
esac
