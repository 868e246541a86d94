#!/usr/bin/env bash
# The project's test command: installs what it needs, builds, runs every test
# (unit, property, end-to-end against real processes and a real slapd), then the
# simulator's regression seeds and a batch of fresh random seeds, then every fuzz target for
# a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TERM_COLOR=never
cargo build --workspace --all-targets
cargo build --release -p cairn-sim
rm -rf target/debug/e2e-logs
cargo test --workspace --no-fail-fast -- --test-threads=2
scripts/check-secrets.sh target/debug/e2e-logs
SIM=target/release/cairn-sim
"$SIM" --regressions
"$SIM" --seeds "${SIM_SEEDS:-300}"
# Every fuzz target briefly (cargo-fuzz, installed if missing); FUZZ_SECONDS=0 skips.
if [ "${FUZZ_SECONDS:-10}" != 0 ]; then
    scripts/fuzz.sh all "${FUZZ_SECONDS:-10}"
fi
