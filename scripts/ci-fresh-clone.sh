#!/usr/bin/env bash
# Reproduces CI: clones this repository's committed HEAD into a temporary
# folder and runs `CI=true bash .ci/run` there (a fresh target/, the user's
# caches as they are: ~/.cargo, ~/.cache/gmp-mpfr-sys, pip's cache). Prints
# the step table and the total; exits with CI's exit code. Uncommitted
# changes are not part of the run. Expected time: docs/build.md.
#
# Usage: scripts/ci-fresh-clone.sh [KEEP_DIR]   (default: a removed temp dir)
set -euo pipefail
src=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
dir=${1:-}
if [[ -z $dir ]]; then
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' EXIT
fi
git clone -q "$src" "$dir/logprobe"
cd "$dir/logprobe"
echo "fresh clone of $(git rev-parse --short HEAD) in $dir/logprobe"
CI=true bash .ci/run
