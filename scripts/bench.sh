#!/usr/bin/env bash
# Benchmarks: `scripts/bench.sh kv [SECONDS] [CLIENTS]`, `scripts/bench.sh login [SECONDS] [CLIENTS] [ROUNDS]`
# (LDAP logins against the dev slapd vs direct ldap3 round trips), `scripts/bench.sh ad-login [SECONDS]
# [CLIENTS] [ROUNDS]` (the same against the Samba AD of scripts/dev-ad.sh: LDAPS, a service account,
# sAMAccountName, in-chain nested groups; needs root), `replication`, `reindex`. Builds release binaries and
# prints a Markdown table with Cairn's numbers next to a baseline measured in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-kv}"; shift || true
cargo build --release -q -p cairn -p cairn-tests
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr)"
case "$what" in
    login) exec target/release/bench-login "$@" ;;
    ad-login) exec target/release/bench-login --ad "$@" ;;
    # `scripts/bench.sh replication [SECONDS] [CLIENTS] [LAG_SAMPLES] [RATE] [RESYNC_KEYS]`:
    # replication lag (p50/p99) for perf and DR secondaries, sequential and at a paced RATE,
    # WAL streaming vs the primary's maximum write rate, and Merkle resync time and bytes for
    # RESYNC_KEYS changed keys, each next to a no-secondary baseline.
    replication) exec target/release/bench-replication "$@" ;;
    # `scripts/bench.sh reindex [KEYS] [READERS]`: reindex time and keys/s for KEYS stored
    # keys vs a raw SQLite scan, and API p99 during the reindex vs idle.
    reindex) exec target/release/bench-reindex "$@" ;;
    *) exec target/release/bench "$what" "$@" ;;
esac
