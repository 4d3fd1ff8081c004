#!/usr/bin/env bash
# The main job: `redlock bench` against 5 local redis-server masters that it starts (and
# stops) itself. Installs redis-server when it is missing. Extra arguments go to
# `redlock bench`, e.g. `scripts/bench.sh --clients 4 --resources 2 --duration 10s`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/ensure-redis.sh
exec cargo run --release --quiet --features cli --bin redlock -- bench "$@"
