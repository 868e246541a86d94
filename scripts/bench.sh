#!/usr/bin/env bash
# Benchmarks: `scripts/bench.sh kv [SECONDS] [CLIENTS]`, `scripts/bench.sh login [SECONDS] [CLIENTS]`
# (LDAP logins against the dev slapd vs direct ldap3 round trips). Builds release binaries and
# prints a Markdown table with Cairn's numbers next to a baseline measured in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-kv}"; shift || true
cargo build --release -q -p cairn -p cairn-tests
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr)"
case "$what" in
    login) exec target/release/bench-login "$@" ;;
    *) exec target/release/bench "$what" "$@" ;;
esac
