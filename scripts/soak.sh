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
# Every minute it also samples each server's RSS and fds and each operation's count, errors
# and p99 over that minute into SOAK_OUT/soak-minutes.csv (SOAK_OUT: default a new
# cairn-soak-out.XXXXXX in the temp dir, kept; printed), says at the end whether RSS and
# fds levelled off (the least-squares trend grows < 2 % over the last 30 minutes of runs of
# an hour or more, over the last half of shorter ones), and this script then draws soak-rss.svg, soak-fds.svg and
# soak-p99.svg there with scripts/plot.py (also after a failed or interrupted run).
# It exits non-zero on any error or growth. The servers' logs are then checked for the
# secrets the driver handled (scripts/check-secrets.sh). SOAK_KEEP=1 keeps the temp dir;
# SOAK_NO_BUILD=1 uses the release binaries already built (in $CARGO_TARGET_DIR or target/).
#
# The simulator soak is scripts/sim-soak.sh.
set -euo pipefail

cd "$(dirname "$0")/.."
repo=$(pwd)
target="${CARGO_TARGET_DIR:-$repo/target}"

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
export SOAK_OUT="${SOAK_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/cairn-soak-out.XXXXXX")}"
mkdir -p "$SOAK_OUT"
plots() {
  local csv="$SOAK_OUT/soak-minutes.csv"
  [[ -s "$csv" ]] && (( $(wc -l < "$csv") > 1 )) || return 0
  local header
  header=$(head -1 "$csv")
  cols() { tr ',' '\n' <<<"$header" | grep -E "$1" | paste -sd, -; }
  python3 "$repo/scripts/plot.py" "$csv" "$SOAK_OUT/soak-rss.svg" --x minute --y "$(cols '_rss_mib$')" \
    --title "Soak: RSS per server" --xlabel "minute" --ylabel "RSS (MiB)" || true
  python3 "$repo/scripts/plot.py" "$csv" "$SOAK_OUT/soak-fds.svg" --x minute --y "$(cols '_fds$')" \
    --title "Soak: open file descriptors per server" --xlabel "minute" --ylabel "fds" || true
  python3 "$repo/scripts/plot.py" "$csv" "$SOAK_OUT/soak-p99.svg" --x minute --y "$(cols '_p99_ms$')" \
    --title "Soak: p99 latency per operation (per minute)" --xlabel "minute" --ylabel "p99 (ms)" --logy || true
  echo "soak: per-minute CSV and plots in $SOAK_OUT"
}
cleanup() {
  plots
  bash "$repo/scripts/dev-ldap.sh" stop "$dir/ldap" >/dev/null 2>&1 || true
  if [[ -z "${SOAK_KEEP:-}" ]]; then rm -rf "$dir"; else echo "soak: kept $dir"; fi
}
trap cleanup EXIT

echo "soak: ${secs}s on $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr); dir $dir"
# The directory stops by itself when this script exits (CAIRN_LDAP_WATCH_PID).
eval "$(CAIRN_LDAP_WATCH_PID=$$ bash "$repo/scripts/dev-ldap.sh" start "$dir/ldap")"
export CAIRN_LDAP_URL CAIRN_LDAP_BINDDN CAIRN_LDAP_BINDPASS

set +e
CAIRN_BIN="$target/release/cairn" SOAK_DIR="$dir" "$target/release/soak" "$secs"
rc=$?
set -e
scripts/check-secrets.sh "$dir/logs" || rc=1
exit $rc
