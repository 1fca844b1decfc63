#!/usr/bin/env bash
# For every planted mutant (logprobe_testkit::mutants), `logprobe fuzz
# --kernel mutant:NAME` must find and shrink it with a median time to find of
# at most 60 s over seeds 1-5 (issue 14). Prints a table of times to find
# (and of cases drawn until the finding);
# exit 1 when a median is over 60 s (a seed that finds nothing within the
# search budget counts as infinite) or a finding was not shrunk and written.
#
# Usage: scripts/fuzz-mutants.sh [MUTANT...]   (default: every mutant of the
# catalog, as `logprobe fuzz --list-mutants` prints them)
# Env: FUZZ_SEEDS (default "1 2 3 4 5"), FUZZ_BUDGET (search budget per run,
# default 120s), FUZZ_SHRINK (shrink budget, default 2s), LOGPROBE (binary;
# default: build target/release/logprobe).
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${FUZZ_SEEDS:-"1 2 3 4 5"}
budget=${FUZZ_BUDGET:-120s}
shrink=${FUZZ_SHRINK:-2s}
if [[ -z "${LOGPROBE:-}" ]]; then
    cargo build --release -q -p logprobe-properties --bin logprobe
    LOGPROBE=target/release/logprobe
fi
mutants=("$@")
if [[ ${#mutants[@]} -eq 0 ]]; then
    # The catalog's names (logprobe_testkit::mutants::CATALOG), never a copy.
    mapfile -t mutants < <("$LOGPROBE" fuzz --list-mutants)
    if [[ ${#mutants[@]} -eq 0 ]]; then
        echo "fuzz-mutants.sh: \`$LOGPROBE fuzz --list-mutants\` listed no mutant" >&2
        exit 2
    fi
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
start=$SECONDS
printf '%-28s %-40s %8s  %-24s %s\n' mutant "time to find per seed (s)" median \
    "cases to find per seed" "property (seed 1)"
for m in "${mutants[@]}"; do
    times=()
    cases=()
    prop=""
    for s in $seeds; do
        set +e
        report=$("$LOGPROBE" fuzz --kernel "mutant:$m" --seed "$s" --budget "$budget" \
            --shrink-budget "$shrink" --out "$out" --no-progress 2>/dev/null)
        rc=$?
        set -e
        line=$(grep -m1 '^FOUND' <<<"$report" || true)
        if [[ $rc -eq 1 && -n "$line" ]] && grep -q '^  dump: ' <<<"$report" \
            && grep -q '^  correct twin on this case: passes' <<<"$report"; then
            t=$(sed -E 's/.*time to find ([0-9.]+) s.*/\1/' <<<"$line")
            c=$(($(sed -E 's/.*\(case ([0-9]+) of seed.*/\1/' <<<"$line") + 1))
            [[ -z "$prop" ]] && prop=$(sed -E 's/^FOUND [^:]+:[^:]+: ([^(]+) \(.*/\1/' <<<"$line")
        else
            t=inf
            c=-
            [[ $rc -ne 0 && $rc -ne 1 ]] && echo "$m seed $s: exit $rc" >&2
        fi
        times+=("$t")
        cases+=("$c")
    done
    median=$(printf '%s\n' "${times[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    ok=$(awk -v m="$median" 'BEGIN {print (m != "inf" && m + 0 <= 60) ? 1 : 0}')
    [[ $ok -eq 1 ]] || status=1
    printf '%-28s %-40s %8s  %-24s %s%s\n' "$m" "${times[*]}" "$median" "${cases[*]}" "$prop" \
        "$([[ $ok -eq 1 ]] || echo '  OVER 60 s')"
done
echo "total $((SECONDS - start)) s"
exit $status
