#!/usr/bin/env bash
# The test command: installs redis-server when it is missing, then runs every test
# (unit, integration against local redis-server processes, benches in test mode, doc tests).
# Extra arguments go to both cargo test runs, e.g. `scripts/test.sh harness` to filter.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/ensure-redis.sh

# Every feature: the CLI and its tests, the local-master harness the integration tests and
# benches use. (Default features are the library alone.)
echo "==> cargo test --all-features --all-targets $*"
cargo test --all-features --all-targets "$@"

echo "==> cargo test --all-features --doc $*"
cargo test --all-features --doc "$@"
