#!/usr/bin/env bash
# `logprobe fuzz --exec-persistent` on the numpy example kernel
# (properties/examples/exec): each planted bug must be found under seeds 1-5
# with a median number of cases to find of at most FUZZ_CASES
# (batch-dependent under --require batch-invariant), the correct kernel must
# run clean over FUZZ_CLEAN_CASES cases with every invariance required, and
# the per-call cost of one-shot and persistent transports is printed.
#
# The statistic is deterministic (docs/build.md, "The fuzz checks'
# statistic"): each run draws at most FUZZ_CASES cases (`--cases`), so the
# verdicts do not depend on the machine's load and the runs go concurrently
# (FUZZ_JOBS at a time). The wall-clock budget is a guard against a hang
# only: a run that reaches it fails. Time to find is printed for the record.
# Exit 1 when a median is over FUZZ_CASES (a seed that finds nothing within
# its cases counts as infinite) or the correct kernel fails; 2 on a run that
# neither found nor ended.
#
# Usage: scripts/fuzz-exec.sh [BUG...]   (default: every planted bug)
# Env: PYTHON (with numpy; default python3), FUZZ_SEEDS (default "1 2 3 4 5"),
# FUZZ_CASES (cases per run, default 100), FUZZ_GUARD (wall-clock guard per
# run, default 600s), FUZZ_SHRINK (default 2s), FUZZ_CLEAN_CASES (cases of the
# correct kernel's run, default 1000), FUZZ_JOBS (default nproc),
# FUZZ_TRANSPORT (`persistent`, the default; `oneshot`: the bugs' runs with
# --exec; `wrapped`: the one-shot adapter under --exec-persistent through the
# Python package's wrapper, logprobe/persist.py), LOGPROBE (binary; default:
# build target/release/logprobe).
set -euo pipefail
cd "$(dirname "$0")/.."
# The interpreter itself, not a shim (pyenv's shim costs ~1 s per start).
py=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')
transport=${FUZZ_TRANSPORT:-persistent}
seeds=${FUZZ_SEEDS:-"1 2 3 4 5"}
cases=${FUZZ_CASES:-100}
guard=${FUZZ_GUARD:-600s}
shrink=${FUZZ_SHRINK:-2s}
clean_cases=${FUZZ_CLEAN_CASES:-1000}
jobs=${FUZZ_JOBS:-$(nproc)}
"$py" -c 'import numpy' || { echo "fuzz-exec: $py has no numpy (scripts/install-numpy.sh)" >&2; exit 1; }
if [[ -z "${LOGPROBE:-}" ]]; then
    cargo build --release -q -p logprobe-cli --bin logprobe
    LOGPROBE=target/release/logprobe
fi
LOGPROBE=$(realpath "$LOGPROBE")
adapter=$(realpath properties/examples/exec/adapter.py)
# The one-shot adapter run persistently (`python -m logprobe.persist` of the
# package; as a file it needs only the standard library).
persist=$(realpath properties/python/python/logprobe/persist.py)
bugs=("$@")
if [[ ${#bugs[@]} -eq 0 ]]; then
    bugs=(entropy-no-max-shift padded-vocab-not-truncated dropped-chunk-remainder batch-dependent)
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
start=$SECONDS

# One run: writes "cases seconds property" (or "inf - -") to $out/B.S.
one() {
    local b=$1 s=$2 require=none flag report rc line
    [[ $b == batch-dependent ]] && require=batch-invariant
    if [[ $transport == oneshot ]]; then
        flag=(--exec "$py $adapter --bug $b --in {in} --out {out}")
    elif [[ $transport == wrapped ]]; then
        flag=(--exec-persistent "$py $persist $adapter --bug $b --in {in} --out {out}")
    else
        flag=(--exec-persistent "$py $adapter --persistent --bug $b")
    fi
    set +e
    report=$("$LOGPROBE" fuzz "${flag[@]}" --require "$require" --seed "$s" --cases "$cases" \
        --budget "$guard" --shrink-budget "$shrink" --out "$out/findings-$b-$s" --no-progress 2>/dev/null)
    rc=$?
    set -e
    line=$(grep -m1 '^FOUND' <<<"$report" || true)
    if [[ $rc -eq 1 && -n "$line" ]] && grep -q '^  dump: ' <<<"$report"; then
        local c t p
        c=$(($(sed -E 's/.*\(case ([0-9]+) of seed.*/\1/' <<<"$line") + 1))
        t=$(sed -E 's/.*time to find ([0-9.]+) s.*/\1/' <<<"$line")
        p=$(sed -E 's/^FOUND [^:]+: ([^(]+) \(.*/\1/' <<<"$line")
        echo "$c $t $p" >"$out/$b.$s"
    else
        local drawn
        drawn=$(grep -m1 -oE '^fuzz[^:]*: [0-9]+ cases' <<<"$report" | grep -oE '[0-9]+' || echo '?')
        if [[ $rc -ne 0 && $rc -ne 1 ]] || [[ $drawn != "$cases" ]]; then
            echo "$b seed $s: exit $rc after $drawn of $cases cases (guard $guard)" >&2
            echo "inf guard -" >"$out/$b.$s"
        else
            echo "inf - -" >"$out/$b.$s"
        fi
    fi
}
export -f one
export LOGPROBE py adapter persist transport cases guard shrink out

for b in "${bugs[@]}"; do for s in $seeds; do echo "$b $s"; done; done \
    | xargs -P "$jobs" -L 1 bash -c 'one "$0" "$1"'

# shellcheck source=fuzz-table.sh (the cwd is the repository root)
source scripts/fuzz-table.sh
fuzz_table bug "$out" "$cases" "$seeds" "${bugs[@]}"
status=$fuzz_status
echo
echo "correct kernel, every invariance required, --cases $clean_cases:"
set +e
report=$("$LOGPROBE" fuzz --exec-persistent "$py $adapter --persistent" --seed 1 --cases "$clean_cases" --budget "$guard" \
    --require padding-invariant,chunk-invariant,batch-invariant --out "$out" --no-progress 2>/dev/null)
rc=$?
set -e
grep -E '^(fuzz|calls|padding|chunk|batch|FOUND|  detail)' <<<"$report" || true
[[ $rc -eq 0 ]] || { echo "the correct kernel did not run clean (exit $rc)" >&2; status=1; }
grep -qE "^fuzz[^:]*: $clean_cases cases" <<<"$report" \
    || { echo "the correct kernel's run did not draw its $clean_cases cases within the guard" >&2; status=1; }
echo
echo "per-call cost, correct kernel, 20 cases at V <= 64 (at most 120 s):"
for how in --exec --exec-persistent wrapped; do
    flag=$how
    case $how in
        --exec) cmd="$py $adapter --in {in} --out {out}" ;;
        --exec-persistent) cmd="$py $adapter --persistent" ;;
        wrapped) flag=--exec-persistent; cmd="$py $persist $adapter --in {in} --out {out}" ;;
    esac
    t0=$(date +%s.%N)
    report=$("$LOGPROBE" fuzz "$flag" "$cmd" --seed 1 --cases 20 --budget 120s --vocab 1..64 --out "$out" --no-progress 2>/dev/null || true)
    t1=$(date +%s.%N)
    printf '%-18s %6.1f s wall: %s\n' "$how" "$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')" "$(grep -m1 '^calls' <<<"$report")"
done
echo "fuzz-exec: $((SECONDS - start)) s"
exit $status
