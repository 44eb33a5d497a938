#!/usr/bin/env bash
# Create/update the Python venv used by reckon's integration tests and print
# its python path (the only line on stdout). Idempotent; when the venv already
# matches testdata/requirements.txt it does not run pip at all.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
req="$root/testdata/requirements.txt"
venv="${RECKON_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/reckon/venv}"
py="$venv/bin/python"
stamp="$venv/.reckon-requirements.sha256"

mkdir -p "$(dirname "$venv")"
# Tests may call this concurrently (nextest runs tests in parallel processes).
exec 9>"$venv.lock"
flock 9

want="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ ! -x "$py" ]] || ! "$py" -c 'import sys' >/dev/null 2>&1; then
    if [[ -d "$venv" && -n "$(ls -A "$venv")" && ! -f "$venv/pyvenv.cfg" ]]; then
        echo "test-env.sh: $venv exists and is not a venv; refusing to touch it" >&2
        exit 1
    fi
    python3 -m venv --clear "$venv" >&2
fi
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]] \
    || ! "$py" -c 'import justonce, psycopg, django, pymysql, schemathesis' >/dev/null 2>&1; then
    "$py" -m pip install --quiet --disable-pip-version-check --no-input -r "$req" >&2
    printf '%s\n' "$want" >"$stamp"
fi
printf '%s\n' "$py"
