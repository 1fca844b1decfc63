#!/usr/bin/env bash
# Real-size fused linear + loss dumps (issue 45): bf16, H 4096, V 152064,
# 64 rows, the LM head generated from a seed so no dump carries it
# (docs/dump-from-pytorch.md, "Generated weights"). A correct fused
# computation and planted bugs, each judged by `logprobe verify --expect`:
# the correct one must pass and every bug must fail.
#
#   scripts/real-size-fused.sh [--gradients]
#
# Needs PyTorch (LOGPROBE_TORCH_DIR or PYTHONPATH), the Python package in
# $LOGPROBE_VENV (default target/python-venv, made by `scripts/run.sh
# python`) and the binary ($LOGPROBE, default target/release/logprobe).
# Forward only (CI): about 2 minutes on 2 cores. `--gradients` adds three
# dumps of 1.25 GB each (grad_lm_head_weight) and about 6 minutes; its
# bf16-accumulation bug is not caught yet (the script's docstring), so it
# exits 1 and is not in CI.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${LOGPROBE_VENV:-target/python-venv}"
bin="${LOGPROBE:-target/release/logprobe}"
torch="${LOGPROBE_TORCH_DIR:-}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
PYTHONPATH="${torch:+$torch:}${PYTHONPATH:-}" "$venv/bin/python" \
    scripts/torch_dumps/fused_linear_real_size_bugs.py "$out" 64 "$@"
"$bin" verify --no-progress --expect "$out/expected.json" "$out"/*.safetensors
