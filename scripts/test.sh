#!/usr/bin/env bash
# The test command: installs redis-server when it is missing, then runs every test
# (unit, integration against local redis-server processes, benches in test mode, doc tests),
# without and with the `tls` feature (TLS tests need the openssl command).
# Extra arguments go to both cargo test runs, e.g. `scripts/test.sh harness` to filter.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/ensure-redis.sh

# The TLS tests make their certificates with the openssl command and also check against
# the system's trust roots: install both when missing (Debian/Ubuntu).
if ! command -v openssl >/dev/null 2>&1 || [ ! -d /etc/ssl/certs ]; then
    echo "==> installing openssl and ca-certificates"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq && $sudo apt-get install -y -qq openssl ca-certificates
fi

# Every feature: the CLI and its tests, the local-master harness the integration tests and
# benches use. (Default features are the library alone.)
echo "==> cargo test --all-features --all-targets $*"
cargo test --all-features --all-targets "$@"

echo "==> cargo test --all-features --doc $*"
cargo test --all-features --doc "$@"
