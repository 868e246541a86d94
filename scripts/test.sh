#!/usr/bin/env bash
# The project's test command: installs what it needs, builds, runs every test
# (unit, property, end-to-end against real processes and a real slapd), then the
# simulator's regression seeds and a batch of fresh random seeds, then every fuzz target for
# a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase prints its time, so a slow phase shows where it is.
t0=$SECONDS; tp=$SECONDS
phase() { echo "test.sh: phase done in $((SECONDS - tp)) s (total $((SECONDS - t0)) s): $*" >&2; tp=$SECONDS; }
scripts/setup.sh
phase setup
export CARGO_TERM_COLOR=never
# No incremental caches: a one-shot build gains nothing from them and they double the disk
# the debug target takes.
export CARGO_INCREMENTAL=0
df -h . | sed 's/^/disk: /'
# Style and lints first (the determinism bans of core/ and sim/ are clippy lints).
cargo fmt --all -- --check
phase fmt
cargo clippy --workspace --all-targets -- -D warnings
phase clippy
cargo build --workspace --all-targets
phase debug build
cargo build --release -p cairn-sim
phase release sim build
# The end-to-end tests run the binary built above, not a second build of their own.
export CAIRN_BIN="$PWD/target/debug/cairn"
rm -rf target/debug/e2e-logs
cargo test --workspace --no-fail-fast -- --test-threads=2
phase tests
scripts/check-secrets.sh target/debug/e2e-logs
SIM=target/release/cairn-sim
"$SIM" --regressions
"$SIM" --seeds "${SIM_SEEDS:-300}"
# The turmoil tier (real async sockets: connection breaks, backpressure, partitions during a
# Merkle sync), then one seed twice: the same trace hash.
"$SIM" --tier turmoil --seeds "${SIM_TURMOIL_SEEDS:-20}"
a=$("$SIM" --tier turmoil --seed 7 | tail -1); b=$("$SIM" --tier turmoil --seed 7 | tail -1)
[ "$a" = "$b" ] || { echo "turmoil seed 7 did not replay: $a vs $b" >&2; exit 1; }
phase simulator
# Every fuzz target briefly (cargo-fuzz, installed if missing); FUZZ_SECONDS=0 skips.
if [ "${FUZZ_SECONDS:-10}" != 0 ]; then
    scripts/fuzz.sh all "${FUZZ_SECONDS:-10}"
fi
phase fuzz
du -sh target 2>/dev/null | sed 's/^/disk used by target: /' || true
