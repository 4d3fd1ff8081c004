#!/usr/bin/env bash
# Issue 22's scaling measurement: lock throughput through 3 masters that are local clusters
# of 1, 2 and 3 shard primaries, every primary under the same cgroup CPU quota (so the
# servers, not the machine, bound the rate), 64 locks in flight. The runs are interleaved
# (1, 2, 3, 1, 2, 3, ...) so that noise on the machine hits every configuration alike; the
# summary gives each configuration's median rate, its ratio to 1 shard, and the server CPU
# per lock+release cycle (INFO cpu, summed over every shard primary of the 3 masters).
#
#   scripts/shard-scaling.sh                      # 5 rounds of 5 s runs, 0.05 core per primary
#   ROUNDS=5 DURATION=8s CPU=0.2 scripts/shard-scaling.sh
#   RELEASE_WITH_NEXT=0 scripts/shard-scaling.sh  # wait for each batch's releases
#   scripts/shard-scaling.sh --clients 4 --in-flight 16   # extra arguments go to every bench
#
# Needs the cgroup v1 cpu controller, writable (root). Every run starts its own clusters and
# stops them. Each run's JSON is kept in $OUT (default: a temporary directory).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5s}
# 0.05 core per primary: 9 primaries at 3 shards then take 0.45 core, which leaves this
# 2-core machine's other work (the client, builds beside) room, so the quotas bind.
CPU=${CPU:-0.05}
# Each batch's releases go out with the next batch's locks (one server turn per shard and
# cycle instead of two: with more shards each turn carries fewer of the 64 requests, and a
# turn's own cost is what otherwise grows the servers' CPU per cycle with the shards).
RELEASE_WITH_NEXT=${RELEASE_WITH_NEXT:-1}
extra=()
[ "$RELEASE_WITH_NEXT" = 1 ] && extra+=(--release-with-next)
SHARDS=${SHARDS:-"1 2 3"}
IN_FLIGHT=${IN_FLIGHT:-64}
# 6,400 resource names, each batch taking the next 64: the batches' names change, so that
# every shard gets its share over a run (64 fixed names hash unevenly: one shard of three
# took 40% of them in a measured run, and that shard bounds every batch), as the many keys
# of a service that needs sharding do.
RESOURCES=${RESOURCES:-6400}
OUT=${OUT:-$(mktemp -d -t shard-scaling.XXXXXX)}
mkdir -p "$OUT"

say() { echo "shard-scaling.sh: $*" >&2; }
command -v jq >/dev/null || { say "needs jq (apt-get install jq) to read the JSON reports"; exit 69; }

bash scripts/ensure-redis.sh >&2
say "building redlock (cargo build --release --features cli)"
cargo build --release --features cli --bin redlock >&2
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
bin="${target_dir:-target}/release/redlock"

say "$("$bin" --version); $(redis-server --version | cut -d' ' -f1-3); $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg)"
say "3 masters of S shard primaries each, S in: $SHARDS; $CPU core per primary; $IN_FLIGHT locks in flight${extra[*]:+ (${extra[*]})} over $RESOURCES resources; $ROUNDS rounds of $DURATION, interleaved; JSON in $OUT"
printf '%-6s %-3s %12s %8s %10s %10s %s\n' round S cycles/s errors srv-us/cyc cli-us/cyc "operations per shard (master 1)"
for round in $(seq 1 "$ROUNDS"); do
    for s in $SHARDS; do
        f="$OUT/r$round-s$s.json"
        code=0
        "$bin" bench --local 3 --local-shards "$s" --shard-cpu "$CPU" --in-flight "$IN_FLIGHT" \
            --resources "$RESOURCES" --duration "$DURATION" --json "${extra[@]}" "$@" >"$f" || code=$?
        if [ "$code" -ne 0 ]; then
            say "round $round, $s shards: redlock bench exited $code (JSON, if any, in $f)"
            exit "$code"
        fi
        read -r rate errors srv cli ops < <(jq -r '[.throughput_per_s, .errors,
            .servers.cpu_us_per_cycle, .cpu_us_per_cycle.total,
            (.servers.per_master[0].shards // [] | map(.operations | tostring) | join("/"))]
            | map(tostring) | join(" ")' "$f")
        printf '%-6s %-3s %12s %8s %10s %10s %s\n' "$round" "$s" "$rate" "$errors" "$srv" "$cli" "$ops"
        echo "$s $rate $srv" >>"$OUT/rates"
    done
done

echo
printf '%-3s %14s %8s %18s\n' S "median cycles/s" ratio "server µs/cycle"
awk -v shards="$SHARDS" '
    { rate[$1] = rate[$1] " " $2; srv[$1] = srv[$1] " " $3 }
    function median(list,   a, n, i, j, t) {
        n = split(list, a, " ")
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    END {
        n = split(shards, s, " ")
        base = median(rate[s[1]])
        for (i = 1; i <= n; i++) {
            m = median(rate[s[i]])
            printf "%-3s %14.0f %8.2f %18.1f\n", s[i], m, m / base, median(srv[s[i]])
        }
    }' "$OUT/rates"
