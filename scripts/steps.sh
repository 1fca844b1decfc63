# Step timer for .ci/run and scripts/ci-fresh-clone.sh (sourced, not run).
#
#   step NAME CMD [ARGS...]   runs CMD, prints its wall time, records it;
#                             a failing step ends the run (its exit code)
#   step_table                prints every recorded step (also on exit)
#
# Wall seconds with one decimal (`date +%s.%N`); the table ends with the
# total and the machine's 1-minute load at the end, so two tables can be
# compared for how busy the machine was.

_step_names=()
_step_secs=()
_step_codes=()
_step_t0=$(date +%s.%N)

_now() { date +%s.%N; }

step() {
    local name=$1
    shift
    echo "== $name"
    local t0 rc=0
    t0=$(_now)
    "$@" || rc=$?
    local dt
    dt=$(awk -v a="$t0" -v b="$(_now)" 'BEGIN {printf "%.1f", b - a}')
    _step_names+=("$name")
    _step_secs+=("$dt")
    _step_codes+=("$rc")
    echo "-- $name: $dt s (exit $rc)"
    if [[ $rc -ne 0 ]]; then
        echo "step '$name' failed (exit $rc)" >&2
        exit "$rc"
    fi
}

step_table() {
    local total i
    total=$(awk -v a="$_step_t0" -v b="$(_now)" 'BEGIN {printf "%.1f", b - a}')
    echo
    echo "== step table (wall seconds; load $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?'), $(nproc 2>/dev/null || echo '?') cores)"
    printf '%-44s %9s %5s\n' step seconds exit
    for i in "${!_step_names[@]}"; do
        printf '%-44s %9s %5s\n' "${_step_names[$i]}" "${_step_secs[$i]}" "${_step_codes[$i]}"
    done
    printf '%-44s %9s\n' total "$total"
}

trap step_table EXIT
