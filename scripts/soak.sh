#!/usr/bin/env bash
# Soak real servers: a primary with a performance secondary and a DR secondary (release
# build of cairn, loopback, TLS cluster channel) and a dev slapd (scripts/dev-ldap.sh), all
# from a temp dir, under mixed traffic for a bounded time.
#
#   scripts/soak.sh [DURATION]
#
# DURATION: 90s, 10m, 2h, or a bare number of minutes (default 5m). The load driver
# (tests/src/bin/soak.rs) drives LDAP logins on the primary and the performance secondary,
# KV writes and reads on the primary, KV reads and token creation on the secondary, then
# prints throughput per operation, errors (target 0), p50/p99 latency, and each server's RSS
# and open file descriptors after setup, after the warm-up (SOAK_WARMUP seconds, default
# 10) and at the end (target: flat), and whether the secondaries converged afterwards.
# It exits non-zero on any error. The servers' logs are then checked for the secrets the
# driver handled (scripts/check-secrets.sh). SOAK_KEEP=1 keeps the temp dir; SOAK_NO_BUILD=1
# uses the release binaries already built.
#
# The simulator soak is scripts/sim-soak.sh.
set -euo pipefail

cd "$(dirname "$0")/.."
repo=$(pwd)

duration="${1:-5m}"
case "$duration" in
  *h) secs=$(( ${duration%h} * 3600 )) ;;
  *m) secs=$(( ${duration%m} * 60 )) ;;
  *s) secs=${duration%s} ;;
  ''|*[!0-9]*) echo "soak.sh: bad duration '$duration' (use 90s, 10m, 2h or minutes)" >&2; exit 2 ;;
  *) secs=$(( duration * 60 )) ;;
esac

if [[ -z "${SOAK_NO_BUILD:-}" ]]; then
  echo "soak: building release binaries (SOAK_NO_BUILD=1 skips this)"
  cargo build --release --quiet -p cairn -p cairn-tests --bin cairn --bin soak
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/cairn-soak.XXXXXX")
cleanup() {
  bash "$repo/scripts/dev-ldap.sh" stop "$dir/ldap" >/dev/null 2>&1 || true
  if [[ -z "${SOAK_KEEP:-}" ]]; then rm -rf "$dir"; else echo "soak: kept $dir"; fi
}
trap cleanup EXIT

echo "soak: ${secs}s on $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr); dir $dir"
# The directory stops by itself when this script exits (CAIRN_LDAP_WATCH_PID).
eval "$(CAIRN_LDAP_WATCH_PID=$$ bash "$repo/scripts/dev-ldap.sh" start "$dir/ldap")"
export CAIRN_LDAP_URL CAIRN_LDAP_BINDDN CAIRN_LDAP_BINDPASS

set +e
CAIRN_BIN="$repo/target/release/cairn" SOAK_DIR="$dir" "$repo/target/release/soak" "$secs"
rc=$?
set -e
scripts/check-secrets.sh "$dir/logs" || rc=1
exit $rc
