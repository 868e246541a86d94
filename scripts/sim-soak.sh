#!/usr/bin/env bash
# Soak the fast simulator: run batches of random seeds until a wall-time budget is spent.
#
#   scripts/sim-soak.sh [DURATION] [extra cairn-sim arguments...]
#
# DURATION: 90s, 10m, 2h, or a bare number of minutes (default 10m). Each batch runs
#   cargo run -p cairn-sim --release -- --seeds $SOAK_BATCH
# from a fresh random starting seed (printed by cairn-sim, with the command to repeat it).
# The first broken invariant stops the soak with a non-zero exit and the replay command;
# add that seed to sim/regressions once it is understood.
#
# Every invariant is checked strictly. SOAK_BATCH (default 200) sets the seeds per batch.
set -euo pipefail

cd "$(dirname "$0")/.."

duration="${1:-10m}"
shift || true

case "$duration" in
  *h) budget=$(( ${duration%h} * 3600 )) ;;
  *m) budget=$(( ${duration%m} * 60 )) ;;
  *s) budget=${duration%s} ;;
  ''|*[!0-9]*) echo "sim-soak.sh: bad duration '$duration' (use 90s, 10m, 2h or minutes)" >&2; exit 2 ;;
  *) budget=$(( duration * 60 )) ;;
esac

batch="${SOAK_BATCH:-200}"
extra=("$@")

echo "soak: ${budget}s wall budget, ${batch} seeds per batch, extra args: ${extra[*]:-none}"
cargo build -p cairn-sim --release --quiet

start=$(date +%s)
batches=0
while :; do
  now=$(date +%s)
  left=$(( start + budget - now ))
  if (( left <= 0 )); then
    break
  fi
  set +e
  timeout --foreground "${left}s" \
    cargo run -p cairn-sim --release --quiet -- --seeds "$batch" "${extra[@]}"
  rc=$?
  set -e
  case $rc in
    0) batches=$(( batches + 1 )) ;;
    124) echo "soak: time budget reached during a batch"; break ;;
    *) echo "soak: FAILED (exit $rc) after $(( $(date +%s) - start ))s; see the report above"; exit "$rc" ;;
  esac
done
echo "soak: no invariant broken in $(( $(date +%s) - start ))s (${batches} full batches of ${batch} seeds)"
