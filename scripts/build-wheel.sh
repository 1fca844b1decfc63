#!/usr/bin/env bash
# Builds the Python package's release artifacts into target/wheels:
#   - an abi3 wheel (CPython >= 3.9) tagged manylinux_2_34 (glibc 2.34+,
#     x86-64 baseline; maturin's auditwheel check fails the build on any
#     symbol newer than the policy allows),
#   - an sdist (pip builds it with a Rust toolchain where no wheel fits),
# then checks them: `twine check` (metadata renders) and
# scripts/check-wheel-isa.py (no AVX2 / AVX-512 / FMA instruction outside the
# run-time dispatched paths). Prints the wheel's path last.
#
# maturin and twine come from PyPI into a build venv (target/build-venv).
# The wheel is compiled into the workspace's target/ with .cargo/config.toml's
# flags (docs/build.md), so after `cargo test --workspace --release` only the
# crates that differ in features are compiled (pyo3, dlpark, the product
# crates without candle).
set -euo pipefail
cd "$(dirname "$0")/.."
out="$PWD/target/wheels"
venv="${LOGPROBE_BUILD_VENV:-$PWD/target/build-venv}"
if [ ! -x "$venv/bin/maturin" ] || [ ! -x "$venv/bin/twine" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "maturin>=1.9,<2" "twine>=5"
fi
mkdir -p "$out"
rm -f "$out"/logprobe-*.whl "$out"/logprobe-*.tar.gz
t0=$(date +%s)
# The platform tag, auditwheel mode and CPU baseline are in
# properties/python/pyproject.toml ([tool.maturin]).
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}" \
    "$venv/bin/maturin" build --release -q -m properties/python/Cargo.toml --out "$out" >&2
t1=$(date +%s)
"$venv/bin/maturin" sdist -m properties/python/Cargo.toml --out "$out" >&2
"$venv/bin/twine" check --strict "$out"/logprobe-*.whl "$out"/logprobe-*.tar.gz >&2
wheel="$(ls "$out"/logprobe-*.whl)"
python3 scripts/check-wheel-isa.py "$wheel" >&2
echo "build-wheel: wheel in $((t1 - t0)) s: $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)" >&2
echo "$wheel"
