#!/usr/bin/env bash
# The test command: installs redis-server when it is missing, then runs every test
# (unit, integration against local redis-server processes, benches in test mode, doc tests).
# Extra arguments go to both cargo test runs, e.g. `scripts/test.sh harness` to filter.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/ensure-redis.sh

echo "==> cargo test --all-targets $*"
cargo test --all-targets "$@"

echo "==> cargo test --doc $*"
cargo test --doc "$@"
