#!/usr/bin/env bash
# The project's test command: installs what it needs, builds, runs every test
# (unit, property, end-to-end against real processes and a real slapd, the fuzz targets'
# entry points on their corpora and seeded mutations), and, beside them, the simulator's
# regression seeds and a batch of fresh random seeds on both tiers.
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
# The connection-flood test holds 2,200 sockets open (and the server its side of them): raise
# the soft descriptor limit to the hard one when it is lower than that needs.
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt 8192 ]; then
    ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
fi
df -h . | sed 's/^/disk: /'
# Style and lints first (the determinism bans of core/ and sim/ are clippy lints).
cargo fmt --all -- --check
phase fmt
cargo clippy --workspace --all-targets -- -D warnings
phase clippy
cargo build --workspace --all-targets
phase debug build
# The simulator runs in the background while the end-to-end tests (which mostly wait on
# sockets and child processes) use the debug build: its release build, its own tests
# (determinism, the planted-bug checks, the regression seeds; in release they take seconds),
# then the CLI runs: regression seeds, fresh fast-tier seeds, the turmoil tier (real async
# sockets: connection breaks, backpressure, partitions during a Merkle sync), and one seed
# run twice that must give the same trace hash. Its output goes to target/sim.log, printed
# when it ends.
sim_phase() {
    set -e
    cargo build --release -p cairn-sim --all-targets
    cargo test --release -p cairn-sim --no-fail-fast
    local sim=target/release/cairn-sim
    "$sim" --regressions
    "$sim" --seeds "${SIM_SEEDS:-300}"
    "$sim" --tier turmoil --seeds "${SIM_TURMOIL_SEEDS:-20}"
    "$sim" --tier ha --seeds "${SIM_HA_SEEDS:-100}"
    # HA regression: a deposed secondary-cluster node reloads with its trees rebuilt, catches
    # up, and only then runs the Merkle diff it owes (the checker once took that for a diff
    # without cause: resume-without-resync).
    "$sim" --tier ha --seed 13213385729989710605
    # The scale profile: 1 primary, 12 performance and 3 DR secondaries per seed.
    "$sim" --profile scale --steps 20000 --seeds "${SIM_SCALE_SEEDS:-5}"
    "$sim" --tier ha --profile scale --steps 20000 --seeds "${SIM_HA_SCALE_SEEDS:-4}"
    "$sim" --tier turmoil --profile scale --steps 10000 --seeds "${SIM_SCALE_TURMOIL_SEEDS:-2}"
    local a b
    a=$("$sim" --tier turmoil --seed 7 | tail -1); b=$("$sim" --tier turmoil --seed 7 | tail -1)
    [ "$a" = "$b" ] || { echo "turmoil seed 7 did not replay: $a vs $b" >&2; exit 1; }
    a=$("$sim" --tier ha --seed 7 | tail -1); b=$("$sim" --tier ha --seed 7 | tail -1)
    [ "$a" = "$b" ] || { echo "ha seed 7 did not replay: $a vs $b" >&2; exit 1; }
    a=$("$sim" --seed 7 | tail -1); b=$("$sim" --seed 7 | tail -1)
    [ "$a" = "$b" ] || { echo "fast-tier seed 7 did not replay: $a vs $b" >&2; exit 1; }
    echo "simulator: ok"
}
( sim_phase ) > target/sim.log 2>&1 &
sim_pid=$!
# The end-to-end tests run the binary built above, not a second build of their own. The
# fuzz targets' entry points run here too, on their corpora and seeded mutations of them
# (cairn-core `fuzzing::tests`); the coverage-guided campaigns are `scripts/fuzz.sh`.
export CAIRN_BIN="$PWD/target/debug/cairn"
rm -rf target/debug/e2e-logs
# The core's unit and property tests (pure CPU, ~2 min) run beside the end-to-end tests
# too: their test binary directly (a second `cargo test` would wait for the first's lock),
# from the crate's directory as cargo runs it. Output in target/core-tests.log.
core_bin=$(cargo test -p cairn-core --lib --no-run 2>&1 | grep -oE 'target/debug/deps/cairn_core-[0-9a-f]+' | tail -1)
[ -x "$core_bin" ] || { echo "test.sh: no cairn-core test binary found" >&2; exit 1; }
( cd core && "../$core_bin" --test-threads=2 ) > target/core-tests.log 2>&1 &
core_pid=$!
tests_rc=0
cargo test --workspace --exclude cairn-sim --exclude cairn-core --no-fail-fast -- --test-threads=2 || tests_rc=$?
cargo test -p cairn-core --doc || tests_rc=$?
phase "end-to-end and shell tests (debug; the core's tests and the simulator beside them)"
core_rc=0
wait "$core_pid" || core_rc=$?
sed 's/^/core: /' target/core-tests.log | grep -vE '^core: test .* \.\.\. ok$' || true
phase "core unit and property tests (in the background)"
sim_rc=0
wait "$sim_pid" || sim_rc=$?
sed 's/^/sim: /' target/sim.log
phase "simulator (release, in the background)"
[ "$tests_rc" = 0 ] || { echo "test.sh: cargo test failed (exit $tests_rc)" >&2; exit 1; }
[ "$core_rc" = 0 ] || { echo "test.sh: the core's tests failed (exit $core_rc); see the core: lines above" >&2; exit 1; }
[ "$sim_rc" = 0 ] || { echo "test.sh: the simulator phase failed (exit $sim_rc); see the sim: lines above" >&2; exit 1; }
scripts/check-secrets.sh target/debug/e2e-logs
# Coverage-guided fuzzing (cargo-fuzz, a build of its own) is not part of this command:
# FUZZ_SECONDS=N runs every target N seconds after the rest (as `scripts/fuzz.sh all N`).
if [ "${FUZZ_SECONDS:-0}" != 0 ]; then
    scripts/fuzz.sh all "$FUZZ_SECONDS"
    phase fuzz
fi
echo "test.sh: all passed in $((SECONDS - t0)) s"
du -sh target 2>/dev/null | sed 's/^/disk used by target: /' || true
