# The fuzz scripts' summary (sourced by fuzz-mutants.sh and fuzz-exec.sh).
#
#   fuzz_table LABEL DIR CAP SEEDS NAME...
# reads DIR/NAME.SEED ("cases seconds property", or "inf ..." for a miss and
# "inf guard ..." for a run stopped by the wall-clock guard), prints one row
# per NAME (cases to find per seed, their median, times, the property), and
# sets `fuzz_status`: 0 when every median is at most CAP, 1 when one is not,
# 2 when a run hit the guard.
fuzz_table() {
    local label=$1 dir=$2 cap=$3 seeds=$4
    shift 4
    fuzz_status=0
    printf '%-28s %-26s %7s  %-32s %s\n' "$label" "cases to find per seed" median \
        "time to find per seed (s)" "property (seed 1)"
    local n s c t p cs ts prop median ok
    for n in "$@"; do
        cs=()
        ts=()
        prop=""
        for s in $seeds; do
            read -r c t p <"$dir/$n.$s"
            cs+=("$c")
            ts+=("$t")
            [[ -z "$prop" && $p != - ]] && prop=$p
            [[ $t == guard ]] && fuzz_status=2
        done
        median=$(printf '%s\n' "${cs[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
        ok=$(awk -v m="$median" -v cap="$cap" 'BEGIN {print (m != "inf" && m + 0 <= cap) ? 1 : 0}')
        [[ $ok -eq 1 || $fuzz_status -ne 0 ]] || fuzz_status=1
        printf '%-28s %-26s %7s  %-32s %s%s\n' "$n" "${cs[*]}" "$median" "${ts[*]}" "${prop:-none}" \
            "$([[ $ok -eq 1 ]] || echo "  NOT FOUND IN $cap CASES")"
    done
}
