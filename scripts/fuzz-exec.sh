#!/usr/bin/env bash
# `logprobe fuzz --exec-persistent` on the numpy example kernel
# (properties/examples/exec): each planted bug must be found with a median
# time to find of at most 60 s over seeds 1-5 (batch-dependent under
# --require batch-invariant), the correct kernel must run clean with every
# invariance required, and the per-call cost of one-shot and persistent
# transports is printed. Exit 1 when a median is over 60 s (a seed that finds
# nothing within the search budget counts as infinite) or the correct kernel
# fails.
#
# Usage: scripts/fuzz-exec.sh [BUG...]   (default: every planted bug)
# Env: PYTHON (with numpy; default python3), FUZZ_SEEDS (default "1 2 3 4 5"),
# FUZZ_BUDGET (search budget per run, default 120s), FUZZ_SHRINK (default 2s),
# FUZZ_CLEAN (budget of the correct kernel's run, default 60s), FUZZ_TRANSPORT
# (`persistent`, the default, or `oneshot`: the bugs' runs with --exec), LOGPROBE
# (binary; default: build target/release/logprobe).
set -euo pipefail
cd "$(dirname "$0")/.."
# The interpreter itself, not a shim (pyenv's shim costs ~1 s per start).
py=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')
transport=${FUZZ_TRANSPORT:-persistent}
seeds=${FUZZ_SEEDS:-"1 2 3 4 5"}
budget=${FUZZ_BUDGET:-120s}
shrink=${FUZZ_SHRINK:-2s}
clean=${FUZZ_CLEAN:-60s}
"$py" -c 'import numpy' || { echo "fuzz-exec: $py has no numpy (scripts/install-numpy.sh)" >&2; exit 1; }
if [[ -z "${LOGPROBE:-}" ]]; then
    cargo build --release -q -p logprobe-properties --bin logprobe
    LOGPROBE=target/release/logprobe
fi
LOGPROBE=$(realpath "$LOGPROBE")
adapter=$(realpath properties/examples/exec/adapter.py)
bugs=("$@")
if [[ ${#bugs[@]} -eq 0 ]]; then
    bugs=(entropy-no-max-shift padded-vocab-not-truncated dropped-chunk-remainder batch-dependent)
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
start=$SECONDS
printf '%-28s %-40s %8s  %s\n' bug "time to find per seed (s)" median "property (seed 1)"
for b in "${bugs[@]}"; do
    require=none
    [[ $b == batch-dependent ]] && require=batch-invariant
    times=()
    prop=""
    for s in $seeds; do
        set +e
        if [[ $transport == oneshot ]]; then
            flag=(--exec "$py $adapter --bug $b --in {in} --out {out}")
        else
            flag=(--exec-persistent "$py $adapter --persistent --bug $b")
        fi
        report=$("$LOGPROBE" fuzz "${flag[@]}" \
            --require "$require" --seed "$s" --budget "$budget" --shrink-budget "$shrink" \
            --out "$out" --no-progress 2>/dev/null)
        rc=$?
        set -e
        line=$(grep -m1 '^FOUND' <<<"$report" || true)
        if [[ $rc -eq 1 && -n "$line" ]] && grep -q '^  dump: ' <<<"$report"; then
            t=$(sed -E 's/.*time to find ([0-9.]+) s.*/\1/' <<<"$line")
            [[ -z "$prop" ]] && prop=$(sed -E 's/^FOUND [^:]+: ([^(]+) \(.*/\1/' <<<"$line")
        else
            t=inf
            [[ $rc -ne 0 && $rc -ne 1 ]] && echo "$b seed $s: exit $rc" >&2
        fi
        times+=("$t")
    done
    median=$(printf '%s\n' "${times[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    ok=$(awk -v m="$median" 'BEGIN {print (m != "inf" && m + 0 <= 60) ? "ok" : "SLOW"}')
    [[ $ok == ok ]] || status=1
    printf '%-28s %-40s %8s  %s %s\n' "$b" "${times[*]}" "$median" "${prop:-none}" "$([[ $ok == ok ]] || echo '<- over 60 s')"
done
echo
echo "correct kernel, every invariance required, --budget $clean:"
set +e
report=$("$LOGPROBE" fuzz --exec-persistent "$py $adapter --persistent" --seed 1 --budget "$clean" \
    --require padding-invariant,chunk-invariant,batch-invariant --out "$out" --no-progress 2>/dev/null)
rc=$?
set -e
grep -E '^(fuzz|calls|padding|chunk|batch|FOUND|  detail)' <<<"$report" || true
[[ $rc -eq 0 ]] || { echo "the correct kernel did not run clean (exit $rc)" >&2; status=1; }
echo
echo "per-call cost, correct kernel, 20 cases at V <= 64 (at most 120 s):"
for flag in --exec --exec-persistent; do
    if [[ $flag == --exec ]]; then cmd="$py $adapter --in {in} --out {out}"; else cmd="$py $adapter --persistent"; fi
    t0=$(date +%s.%N)
    report=$("$LOGPROBE" fuzz "$flag" "$cmd" --seed 1 --cases 20 --budget 120s --vocab 1..64 --out "$out" --no-progress 2>/dev/null || true)
    t1=$(date +%s.%N)
    printf '%-18s %6.1f s wall: %s\n' "$flag" "$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')" "$(grep -m1 '^calls' <<<"$report")"
done
echo "fuzz-exec: $((SECONDS - start)) s"
exit $status
