#!/usr/bin/env bash
# The long kill -9 campaign (not part of CI; CI runs a short version through
# tests/tests/faults.rs): a primary, a performance secondary and a DR secondary (release
# build), writers remembering every acknowledged write, and N cycles that each kill -9 one
# server during streaming, a Merkle sync, a reindex (primary, perf secondary, the DR
# secondary's own) or a snapshot, restart it, wait for convergence and read acknowledged
# writes back (all of them at the end). See tests/src/kill9/mod.rs.
#
#   scripts/kill-cycles.sh N [SEED]
#
# Prints one line per cycle with running totals, then Markdown tables (kills per role and
# moment, writes attempted / acknowledged / lost, convergence). A failure prints the seed
# and the command that replays it. KILL_BUDGET_SECS stops starting new cycles after that
# many seconds; touching $KILL_STOP_FILE (default: <tmp>/cairn-kill-cycles.stop) does the
# same at once; either way the final check runs and the tables are printed. KILL_PACE_MS
# (default 10) is the pause between two writes of a writer thread. KILL_NO_BUILD=1 uses the
# release binaries already built.
set -euo pipefail

cd "$(dirname "$0")/.."
repo=$(pwd)
n="${1:?usage: scripts/kill-cycles.sh N [SEED]}"
seed="${2:-}"
target="${CARGO_TARGET_DIR:-$repo/target}"

if [[ -z "${KILL_NO_BUILD:-}" ]]; then
  echo "kill-cycles: building release binaries (KILL_NO_BUILD=1 skips this)"
  cargo build --release --quiet -p cairn -p cairn-tests --bin cairn --bin kill-cycles
fi
export KILL_STOP_FILE="${KILL_STOP_FILE:-${TMPDIR:-/tmp}/cairn-kill-cycles.stop}"
rm -f "$KILL_STOP_FILE"
echo "kill-cycles: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr); touch $KILL_STOP_FILE to stop early"
CAIRN_BIN="$target/release/cairn" exec "$target/release/kill-cycles" "$n" $seed
