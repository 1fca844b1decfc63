#!/usr/bin/env bash
# Fails when a match over `Output` (or its `Family`) in non-test code has a
# catch-all arm (`_ =>`, `o =>`): an output missing from a layer must be a
# compile error, not a value from a default arm (reference/src/spec/output.rs,
# "One table"). Also refuses the partial `PolicyTerm::of(..).expect(..)`.
# Heuristic and cheap: an arm is a catch-all over `Output` when the arm
# before it in the same match names `Output::` or `Family::`. Test modules
# (from `#[cfg(test)]` on) and tests.rs files are skipped.
# Usage: scripts/check-output-arms.sh [FILE...] (default: every crate's src/).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$#" -eq 0 ]; then
    set -- $(git ls-files 'reference/src/*.rs' 'kernels/src/*.rs' 'properties/*src/*.rs' 'properties/src/*.rs' | grep -v '/tests\.rs$')
fi
awk '
    FNR == 1 { prev = ""; skip = 0 }
    /^[[:space:]]*#\[cfg\(test\)\]/ { skip = 1 }
    skip { next }
    /PolicyTerm::of\(.*\)[[:space:]]*\.expect\(/ {
        printf "%s:%d: PolicyTerm::of(..).expect: match on the output'"'"'s family instead\n", FILENAME, FNR
        bad = 1
    }
    /=>/ {
        line = $0
        sub(/^[[:space:]]*\|?[[:space:]]*/, "", line)
        if (line ~ /^(_|[a-z_][a-z0-9_]*)([[:space:]]+if[[:space:]].*)?[[:space:]]*=>/ && line !~ /^(true|false)[[:space:]]/ && prev ~ /^(Output|Family)::/) {
            printf "%s:%d: catch-all arm after %s\n", FILENAME, FNR, substr(prev, 1, 40)
            bad = 1
        }
        prev = line
    }
    END { exit bad }
' "$@" || {
    echo "a catch-all arm over Output: list every output (or family) so a new one is a compile error" >&2
    exit 1
}
