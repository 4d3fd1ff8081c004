#!/usr/bin/env bash
# The loaded-machine check of issue 19: runs the README's test command (scripts/test.sh)
# N times in a row (default 5) while `redlock bench --clients 4 --duration 10m` runs beside
# it on the same cores (restarted whenever it ends, stopped by its PID with SIGTERM, which
# stops its local masters, when the tests end). Stops at the first failing run.
#
#   bash scripts/stress.sh [N]      logs in target/stress/ (run<i>.log, bench<i>.log)
#
# On the 2-core machine of 2026-11-27 each run took 620-656 s at a load of 12-17.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
n=${1:-5}
out=target/stress
mkdir -p "$out"
bash scripts/ensure-redis.sh
cargo build --release --features cli --bin redlock
for i in $(seq 1 "$n"); do
    rm -f "$out/stop"
    (
        while [ ! -e "$out/stop" ]; do
            target/release/redlock bench --clients 4 --duration 10m >>"$out/bench$i.log" 2>&1 &
            echo $! >"$out/bench.pid"
            wait $!
        done
    ) &
    loop=$!
    start=$(date +%s)
    bash scripts/test.sh >"$out/run$i.log" 2>&1
    rc=$?
    touch "$out/stop"
    kill -TERM "$(cat "$out/bench.pid")" 2>/dev/null
    wait "$loop"
    echo "run $i: exit $rc in $(($(date +%s) - start)) s (load $(cut -d' ' -f1-3 /proc/loadavg))"
    grep -h "mutual excl" "$out/bench$i.log" || true
    if [ "$rc" != 0 ]; then
        echo "run $i failed: see $out/run$i.log" >&2
        exit 1
    fi
done
echo "all $n runs passed"
