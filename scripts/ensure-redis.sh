#!/usr/bin/env bash
# Makes sure `redis-server` is available (tests, `redlock bench`); installs the Debian/Ubuntu
# package when it is missing. Idempotent: when it is there, it only prints the version.
#
# It never starts, stops or talks to a system Redis: the tests start their own servers on
# free loopback ports and stop them by PID. (Installing the Debian package may start a
# system service on port 6379; nothing here depends on it or touches it.)
#
# REDIS_SERVER=/path/to/redis-server overrides the lookup on PATH, as in the tests.
set -euo pipefail

say() { echo "ensure-redis: $*"; }
fail() {
    echo "ensure-redis: error: $*" >&2
    exit 1
}
show() { say "using $1 ($("$1" --version))"; }

if [ -n "${REDIS_SERVER:-}" ]; then
    if [ -f "$REDIS_SERVER" ] && [ -x "$REDIS_SERVER" ]; then
        show "$REDIS_SERVER"
        exit 0
    fi
    fail "REDIS_SERVER=$REDIS_SERVER is not an executable file (unset it to use redis-server from PATH)"
fi

if found=$(command -v redis-server 2>/dev/null); then
    show "$found"
    exit 0
fi

say "redis-server not found on PATH: installing the Debian package redis-server"
command -v apt-get >/dev/null 2>&1 ||
    fail "no apt-get on this machine: install redis-server with your package manager, or set REDIS_SERVER=/path/to/redis-server"

if [ "$(id -u)" -eq 0 ]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1; then
    # Without a terminal (CI) sudo must not wait for a password nobody can type.
    if [ -t 0 ]; then sudo=(sudo); else sudo=(sudo -n); fi
else
    fail "not root and no sudo: as root, run \`apt-get update && apt-get install -y redis-server\`, or set REDIS_SERVER=/path/to/redis-server"
fi

run() {
    say "+ ${sudo[*]+${sudo[*]} }$*"
    ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive "$@"
}

run apt-get update ||
    fail "\`apt-get update\` failed (see above); install redis-server by hand, or set REDIS_SERVER"
if ! run apt-get install -y redis-server; then
    # The package's attempt to start a system service can fail (no init system, port 6379
    # taken) while the binary is installed fine: judge by the binary.
    say "warning: apt-get install reported an error; checking for the binary anyway"
fi

hash -r
found=$(command -v redis-server 2>/dev/null) ||
    fail "redis-server is still not on PATH after installing the package; set REDIS_SERVER=/path/to/redis-server"
show "$found"
