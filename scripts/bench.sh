#!/usr/bin/env bash
# The main job: `redlock bench` against 5 local redis-server masters that it starts (and
# stops) itself. Installs redis-server when it is missing. Extra arguments go to
# `redlock bench`, e.g. `scripts/bench.sh --clients 4 --resources 2 --duration 10s`.
#
# It says what it does at each step: the first release build takes a few minutes (about 2
# on a 2-core VM), later ones a few seconds; the bench itself runs 5 s by default.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { echo "bench.sh: $*"; }

bash scripts/ensure-redis.sh

say "building redlock (cargo build --release --features cli; the first build takes a few minutes, cargo shows its progress)"
started=$SECONDS
cargo build --release --features cli --bin redlock
say "built in $((SECONDS - started)) s"

target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
bin="${target_dir:-target}/release/redlock"
say "running $bin bench $*"
exec "$bin" bench "$@"
