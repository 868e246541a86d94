#!/usr/bin/env bash
# Creates (once) a Python virtualenv with the unmodified hvac client from PyPI and prints the
# path of its python interpreter. Used by tests/tests/hvac.rs; safe to run repeatedly.
#
#   scripts/hvac-venv.sh            # venv in target/hvac-venv (or $CAIRN_HVAC_VENV)
#   HVAC_VERSION=2.3.0 scripts/hvac-venv.sh
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${CAIRN_HVAC_VENV:-$root/target/hvac-venv}"
version="${HVAC_VERSION:-2.3.0}"
py="$venv/bin/python"

have() {
    [ -x "$py" ] && "$py" -c "import hvac, sys, importlib.metadata as m; sys.exit(0 if m.version('hvac') == '$version' else 1)" 2>/dev/null
}

if ! have; then
    mkdir -p "$(dirname "$venv")"
    # A half-made venv from an interrupted run is rebuilt from scratch.
    rm -rf "$venv"
    if ! python3 -m venv "$venv" >&2; then
        echo "hvac-venv: 'python3 -m venv' failed (Debian: apt-get install -y python3-venv)" >&2
        exit 1
    fi
    "$py" -m pip install --disable-pip-version-check --quiet "hvac==$version" >&2
    have || { echo "hvac-venv: hvac $version did not install" >&2; exit 1; }
fi
echo "$py"
