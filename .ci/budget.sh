#!/usr/bin/env bash
# Instruction budgets (issue 23): what a lock cycle costs the client, counted by callgrind
# on programs whose count is exact (the core driven in memory with scripted replies, the
# shared client's hand-over and loop over masters scripted in memory, the parser on fixed
# replies: no socket, no clock read, nothing else running), checked against the budgets
# committed in .ci/budgets.txt. Fails when a count is more than 3% over its budget.
#
#   bash .ci/budget.sh           measure and check (CI)
#   bash .ci/budget.sh --write   measure and write the counts into .ci/budgets.txt (then
#                                commit them, saying why when a budget goes up)
#
# Each figure is per cycle: (count at N=hi - count at N=lo) / (hi - lo), so that what
# every run does once (the first cycle's connects and handshakes) cancels out; only the
# instructions under the example's measured function are counted (`--toggle-collect`),
# not its setup. Every count is taken twice: the two must be identical (a measurement
# that moves by itself cannot hold a budget).
#
# Not budgeted here, because not deterministic: anything against real sockets (the
# single-owner and shared clients' cycles in examples/cycles.rs and
# examples/shared_cycles.rs: how many loop turns and partial reads a cycle takes depends
# on when the replies arrive), and the shared client's hand-offs between threads. See
# benches/README.md, "Instruction budgets".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

budgets=.ci/budgets.txt
tolerance_pct=3
write=false
if [[ "${1:-}" == "--write" ]]; then
    write=true
elif [[ -n "${1:-}" ]]; then
    echo "usage: bash .ci/budget.sh [--write]" >&2
    exit 2
fi

if ! command -v valgrind >/dev/null; then
    echo "error: valgrind is not installed (apt-get install valgrind): the instruction" >&2
    echo "budgets cannot be checked" >&2
    exit 1
fi

cargo build --release --example core_cycles --example core_handoff --example parse_replies \
    --example shared_loop_cycles
examples=${CARGO_TARGET_DIR:-target}/release/examples

# The examples' environment: a fixed one (`env -i`, the same PATH everywhere). The
# environment's size moves the initial stack, and memcpy's path (so the count, by a few
# instructions per cycle) depends on the alignment of what it copies.
mode=""
valgrind=$(command -v valgrind)

# count EXAMPLE N [TOGGLE...]: the instructions callgrind collects in one run.
count() {
    local example=$1 n=$2
    shift 2
    local args=(--tool=callgrind --collect-atstart=no --callgrind-out-file=/dev/null)
    for t in "$@"; do
        args+=("--toggle-collect=$t")
    done
    local out
    out=$(env -i PATH=/usr/bin:/bin MODE="$mode" \
        "$valgrind" "${args[@]}" "$examples/$example" "$n" 2>&1 >/dev/null) || {
        echo "$out" >&2
        echo "error: $example $n failed under valgrind" >&2
        exit 1
    }
    local c
    c=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' <<<"$out")
    if [[ -z "$c" || "$c" == 0 ]]; then
        echo "$out" >&2
        echo "error: callgrind collected nothing for $example (toggle: $*)" >&2
        exit 1
    fi
    echo "$c"
}

# twice EXAMPLE N [TOGGLE...]: the count, after checking a second run gives the same.
twice() {
    local a b
    a=$(count "$@") || exit 1
    b=$(count "$@") || exit 1
    if [[ "$a" != "$b" ]]; then
        echo "error: $1 at N=$2 is not deterministic: $a then $b instructions" >&2
        exit 1
    fi
    echo "$a"
}

declare -A measured unit
order=()

# measure NAME UNIT UNITS_PER_STEP LO HI EXAMPLE [TOGGLE...]: the count per UNIT (a
# cycle, a reply...), with UNITS_PER_STEP units in each step of N.
measure() {
    local name=$1 units=$3 lo=$4 hi=$5
    unit[$name]=$2
    shift 5
    local c_lo c_hi
    # (A failed count exits its command substitution only: checked here, in the shell.)
    c_lo=$(twice "$1" "$lo" "${@:2}") || c_lo=
    c_hi=$(twice "$1" "$hi" "${@:2}") || c_hi=
    if [[ -z "$c_lo" || -z "$c_hi" ]]; then
        echo "error: $name: no count (N=$lo: '$c_lo', N=$hi: '$c_hi'), see above" >&2
        exit 1
    fi
    measured[$name]=$(awk -v a="$c_lo" -v b="$c_hi" -v d="$(((hi - lo) * units))" \
        'BEGIN { printf "%.0f", (b - a) / d }')
    order+=("$name")
    printf '%-14s %8s instructions per %-6s (N=%s: %s, N=%s: %s)\n' \
        "$name" "${measured[$name]}" "${unit[$name]}" "$lo" "$c_lo" "$hi" "$c_hi"
}

start=$(date +%s)
# A single-owner lock+release cycle on 5 masters (try_lock, release).
measure single_cycle cycle 1 1000 3000 core_cycles 'core_cycles::run_cycles'
# 64 locks in flight: try_lock x 64 then release x 64 per cycle, each wave in one write
# per master (fewer cycles: each is 64 locks).
mode=batch64 measure batch64_cycle cycle 1 100 300 core_cycles 'core_cycles::run_cycles'
# One contended hand-off: a waiter refused, woken by the holder's release announcement,
# granted, released (the scripted masters' own work left out).
measure handoff cycle 1 1000 3000 core_handoff 'core_handoff::run_cycles' 'core_handoff::script_*'
# The shared client with one caller: try_lock + release on 5 masters, each waited for on
# the caller's thread, which drives the shared loop itself (hand-over, loop, core; the
# loop's own thread parks), over masters scripted in memory (their work left out).
measure shared_cycle cycle 1 1000 3000 shared_loop_cycles 'shared_loop_cycles::run_cycles' \
    'shared_loop_cycles::script_*'
# The parser, per reply (a fixed mix of the replies a lock client reads).
per_pass=$("$examples/parse_replies" 1 | sed -n 's/^replies_per_pass=//p')
measure parse_reply reply "$per_pass" 1000 3000 parse_replies 'parse_replies::run_passes'
echo "measured in $(($(date +%s) - start)) s"

if $write; then
    tmp=$(mktemp)
    grep -E '^\s*(#|$)' "$budgets" >"$tmp" || true
    for name in "${order[@]}"; do
        echo "$name ${measured[$name]}" >>"$tmp"
    done
    mv "$tmp" "$budgets"
    echo "wrote $budgets:"
    grep -vE '^\s*(#|$)' "$budgets"
    exit 0
fi

failed=0
for name in "${order[@]}"; do
    budget=$(awk -v n="$name" '$1 == n { print $2 }' "$budgets")
    figure=${measured[$name]}
    if [[ -z "$budget" ]]; then
        echo "error: $name has no budget in $budgets (measured: $figure)" >&2
        failed=1
        continue
    fi
    limit=$((budget + budget * tolerance_pct / 100))
    if ((figure > limit)); then
        echo "error: $name: $figure instructions per ${unit[$name]}, over its budget $budget by more" \
            "than ${tolerance_pct}% (limit $limit). Find what grew (callgrind_annotate);" \
            "if the cost is meant, raise the budget in $budgets in a commit that says why." >&2
        failed=1
    elif ((figure * 100 < budget * (100 - tolerance_pct))); then
        echo "ok: $name: $figure within its budget $budget (more than ${tolerance_pct}% under:" \
            "lower the budget with 'bash .ci/budget.sh --write' to keep the gain)"
    else
        echo "ok: $name: $figure within its budget $budget (limit $limit)"
    fi
done
exit $failed
