#!/usr/bin/env bash
# Benchmarks: `scripts/bench.sh kv [SECONDS] [CLIENTS]`, `scripts/bench.sh login [SECONDS] [CLIENTS] [ROUNDS]`
# (LDAP logins against the dev slapd vs direct ldap3 round trips), `scripts/bench.sh ad-login [SECONDS]
# [CLIENTS] [ROUNDS]` (the same against the Samba AD of scripts/dev-ad.sh: LDAPS, a service account,
# sAMAccountName, in-chain nested groups; needs root), `replication`, `reindex`, `ha [SECONDS] [TRIALS]
# [CLIENTS]` (an HA cluster on PostgreSQL), `openbao` and `kv-read-limit` (below), and the growth
# curves `growth-secondaries`, `growth-resync`, `growth-keys`, `growth-groups` (below). Builds
# release binaries and prints a Markdown table with Cairn's numbers next to a baseline
# measured in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-kv}"; shift || true
cargo build --release -q -p cairn -p cairn-tests
# Where cargo put them (CARGO_TARGET_DIR when set).
REL="${CARGO_TARGET_DIR:-$PWD/target}/release"
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr)"
case "$what" in
    login) exec "$REL"/bench-login "$@" ;;
    ad-login) exec "$REL"/bench-login --ad "$@" ;;
    # `scripts/bench.sh replication [SECONDS] [CLIENTS] [LAG_SAMPLES] [RATE] [RESYNC_KEYS]`:
    # replication lag (p50/p99) for perf and DR secondaries, sequential and at a paced RATE,
    # WAL streaming vs the primary's maximum write rate, and Merkle resync time and bytes for
    # RESYNC_KEYS changed keys, each next to a no-secondary baseline.
    replication) exec "$REL"/bench-replication "$@" ;;
    # `scripts/bench.sh reindex [KEYS] [READERS]`: reindex time and keys/s for KEYS stored
    # keys vs a raw SQLite scan, and API p99 during the reindex vs idle.
    reindex) exec "$REL"/bench-reindex "$@" ;;
    # `scripts/bench.sh openbao [SECONDS=5] [ROUNDS=3] [CLIENTS=16]`: Cairn (--dev, SQLite) and
    # OpenBao 2.6.2 (scripts/reference.sh; raft storage, initialised and unsealed) against one
    # slapd, phases alternating: LDAP login, token create, KV v1/v2 writes, KV read,
    # lookup-self; req/s, p50/p99, server CPU per request, RSS. See tests/src/bin/bench-openbao.rs.
    openbao) exec "$REL"/bench-openbao openbao "$@" ;;
    # `scripts/bench.sh kv-read-limit [SECONDS=5] [CLIENTS=16] [ROUNDS=3]`: Cairn's KV v1 reads
    # over HTTP vs a tiny_http hello-world server (tests/src/bin/bench-hello.rs), alternating.
    kv-read-limit) exec "$REL"/bench-openbao kv-read-limit "$@" ;;
    # `scripts/bench.sh ha [SECONDS=3] [TRIALS=3] [CLIENTS=32]`: three `cairn server` nodes on one
    # PostgreSQL (scripts/dev-postgres.sh): durable KV writes/s through the active vs pgbench -c 1
    # single-row INSERT ... ON CONFLICT commits; failover time over TRIALS kill -9s of the active
    # under write load and acknowledged writes lost (read back); KV latency through a standby vs
    # the active. See scripts/bench-ha.py. Everything it starts lives in WORK and is stopped on exit.
    # Growth curves (issue #18): each prints a Markdown table with its baseline, writes a CSV
    # and draws an SVG with scripts/plot.py into GROWTH_OUT (default tests/figures/). Sizes are
    # comma lists (100k, 1M, 5M). See each binary's top comment.
    # `growth-secondaries [COUNTS=0,1,2,4,8] [SECONDS=5] [CLIENTS=16] [RATE=500]`: primary
    # write throughput and replication lag p50/p99 vs performance secondaries attached.
    # BENCH_PIN=0:1 pins the load generator and primary to CPU 0 and the secondaries to CPU 1
    # (secondaries standing on other hosts); see the binary's top comment for the others.
    growth-secondaries) exec "$REL"/bench-growth-secondaries "$@" ;;
    # `growth-resync [CHANGED=1k,10k,100k] [TOTALS=10k,30k,100k] [BASE=100k] [FIXED=10k] [CLIENTS=16]`:
    # resync bytes and time vs changed keys (BASE stored) and vs keys stored (FIXED changed;
    # "" skips a curve); stored keys are bulk-loaded encrypted, then reindexed. By catch-up
    # (key-only WAL entries), or by Merkle diff and sync with RESYNC=merkle.
    growth-resync) exec "$REL"/bench-growth-resync "$@" ;;
    # `growth-keys [KEYS=100k,1M] [READS=1000]`: reindex time vs a raw scan + hash, unseal-to-
    # serving time and RSS vs keys stored (bulk-loaded encrypted into SQLite).
    growth-keys) exec "$REL"/bench-growth-keys "$@" ;;
    # `growth-groups [GROUPS=1,10,35,200] [SECONDS=4] [CLIENTS=8] [PAGE=20]`: LDAP logins/s vs
    # groups per user (paged group searches) against the dev slapd, vs direct ldap3.
    growth-groups) exec "$REL"/bench-growth-groups "$@" ;;
    ha)
        WORK=$(mktemp -d "${TMPDIR:-/tmp}/cairn-bench-ha.XXXXXX")
        chmod 755 "$WORK"   # dev-postgres.sh runs the server as `postgres` under WORK/pg when root
        PY=""
        cleanup() {
            local pid
            # bench-ha.py stops what it started on SIGTERM; then anything left is killed here.
            if [ -n "$PY" ] && kill -0 "$PY" 2>/dev/null; then
                kill -TERM "$PY" 2>/dev/null || true
                for _ in $(seq 1 100); do kill -0 "$PY" 2>/dev/null || break; sleep 0.1; done
                kill -9 "$PY" 2>/dev/null || true
            fi
            if [ -f "$WORK/pids" ]; then
                while read -r pid; do
                    # Only a still-running cairn this run started (the pid file lists them).
                    if [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$(readlink -f "$REL"/cairn)" ]; then
                        kill -9 "$pid" 2>/dev/null || true
                    fi
                done < "$WORK/pids"
            fi
            [ -d "$WORK/pg" ] && scripts/dev-postgres.sh stop "$WORK/pg" 2>/dev/null || true
            rm -rf "$WORK"
        }
        trap cleanup EXIT
        trap 'exit 130' INT
        trap 'exit 143' TERM
        # In the background and waited for, so that a signal to this script runs its traps at once.
        CAIRN_BENCH_WORK="$WORK" CAIRN_BIN="$REL/cairn" python3 scripts/bench-ha.py "$@" &
        PY=$!
        wait "$PY"
        ;;
    # `scripts/bench.sh alloc [SECONDS=5] [ROUNDS=4]`: the allocator setting the server makes
    # (mimalloc purge delay 0) vs mimalloc's default, two dev servers side by side, CPU per
    # request and RSS. See scripts/bench-alloc.py.
    alloc) CAIRN_BIN="$REL/cairn" BENCH_LOAD="$REL/bench-load" exec python3 scripts/bench-alloc.py "$@" ;;
    *) exec "$REL"/bench "$what" "$@" ;;
esac
