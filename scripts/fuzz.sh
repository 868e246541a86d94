#!/usr/bin/env bash
# Runs the cargo-fuzz targets of cairn-core (core/fuzz/) for SECONDS each.
#
#   scripts/fuzz.sh TARGET SECONDS      TARGET: one of the targets below, or `all`
#
# Installs cargo-fuzz when missing. Uses a nightly toolchain when rustup has one, else
# stable with RUSTC_BOOTSTRAP=1 (FUZZ_TOOLCHAIN=stable forces the latter). Build output goes
# to $CARGO_TARGET_DIR/fuzz (target/fuzz when CARGO_TARGET_DIR is unset), the growing corpus to target/fuzz-corpus/<target> (not committed; the
# committed seeds in core/fuzz/corpus/<target> are read too), crash reproducers to
# target/fuzz-artifacts/<target>/, logs to target/fuzz-logs/. Prints the executions of each
# target; exits non-zero when a target crashed, with the reproducer and the replay command.
#
# Environment: FUZZ_SANITIZER (default none: the core is safe Rust, so panics, overflows,
# stack exhaustion, timeouts and memory blow-ups are what we look for; `address` works on
# nightly), FUZZ_TIMEOUT (seconds per input, default 20), FUZZ_RSS_MB (default 2048),
# FUZZ_RUNS (stop a target once it has run this many inputs, within SECONDS: a campaign that
# only has to show 10^6 executions within 900 s can stop there and leave the CPU to others),
# FUZZ_JOBS (fuzzer processes per target, libFuzzer's `-jobs=N -workers=N`; each runs the
# whole SECONDS on the shared corpus, picking up the others' new inputs; a target's
# executions are the sum of its workers', FUZZ_RUNS is split among them; logs
# target/fuzz-logs/<target>/fuzz-<i>.log). Default: 1, and the machine's CPUs (at most 4) for
# the targets `target_jobs` names.
#
# A target may be built with options of its own (`target_opts` below), into a build directory
# of its own ($CARGO_TARGET_DIR/fuzz-<options>), so the others keep theirs.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FUZZ_DIR="$ROOT/core/fuzz"
TARGETS=(router json_bodies ldap_filter policy activation peer_msg shamir unauthenticated namespace_isolation snapshot_file server_config kv2_bodies forwarded_request)

# Build options of one target beyond the common ones.
#
# namespace_isolation: --no-trace-compares. Its input bytes are only indices into a fixed
# vocabulary (method, path, body, namespace: `% len`), never compared with anything, so the
# operands that the compare hooks record (libFuzzer's table of compared values, which a mutation
# writes into the input) are the vocabulary's strings and the node's internals, not input
# bytes: no mutation they feed can do better than a random byte, and value profiling is off.
# Coverage (the 8-bit counters of every edge, what libFuzzer keeps inputs for) is the same.
# The hooks were a third of its time (perf: __sanitizer_cov_trace_*cmp*), since every request
# of the up to 24 it sends, and the probes of the other tenants after one that changed
# something outside its namespace, run through the whole router and barrier.
target_opts() {
    case $1 in
        namespace_isolation) echo --no-trace-compares ;;
        *) ;;
    esac
}

# Workers of one target when FUZZ_JOBS is unset.
#
# namespace_isolation: every CPU (at most 4). Each of its inputs sets up three tenants and
# probes what lies outside one after every request that changed something, so one process
# does ~800 inputs per CPU second, short of 10^6 in 900 s; the targets run one at a time, so
# the other CPUs would sit idle.
target_jobs() {
    case $1 in
        namespace_isolation) n=$(nproc 2>/dev/null || echo 1); echo $((n > 4 ? 4 : n)) ;;
        *) echo 1 ;;
    esac
}

usage() {
    echo "usage: $0 TARGET|all SECONDS   (targets: ${TARGETS[*]})" >&2
    exit 2
}

[ $# -eq 2 ] || usage
target=$1
secs=$2
[[ "$secs" =~ ^[0-9]+$ ]] && [ "$secs" -gt 0 ] || usage
if [ "$target" = all ]; then
    run=("${TARGETS[@]}")
else
    found=0
    for t in "${TARGETS[@]}"; do [ "$t" = "$target" ] && found=1; done
    [ $found -eq 1 ] || usage
    run=("$target")
fi

if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

if [ "${FUZZ_TOOLCHAIN:-}" != stable ] && rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    toolchain=+nightly
else
    # The machine's default toolchain (on a fresh machine the only one), made to accept
    # the nightly flags cargo-fuzz passes.
    toolchain=
    export RUSTC_BOOTSTRAP=1
fi
san=${FUZZ_SANITIZER:-none}
target_base="${CARGO_TARGET_DIR:-$ROOT/target}"
flags=(-s "$san" --debug-assertions)

# The build directory for a target's own options (none: the common one).
target_dir() {
    local opts
    opts=$(target_opts "$1")
    if [ -z "$opts" ]; then
        echo "$target_base/fuzz"
    else
        echo "$target_base/fuzz$(echo "$opts" | tr -d ' ' | sed 's/--/-/g')"
    fi
}

cd "$FUZZ_DIR"
start=$SECONDS
# Every target without options of its own: one build of all of them (as before).
common=0
for t in "${run[@]}"; do
    if [ -z "$(target_opts "$t")" ]; then common=1; fi
done
if [ $common -eq 1 ]; then
    echo "fuzz: building targets (cargo $toolchain fuzz build ${flags[*]})" >&2
    CARGO_TARGET_DIR=$(target_dir router) cargo ${toolchain:+"$toolchain"} fuzz build "${flags[@]}" >&2
fi
for t in "${run[@]}"; do
    opts=$(target_opts "$t")
    [ -n "$opts" ] || continue
    echo "fuzz: building $t (cargo $toolchain fuzz build ${flags[*]} $opts $t)" >&2
    # shellcheck disable=SC2086 # the options are words
    CARGO_TARGET_DIR=$(target_dir "$t") cargo ${toolchain:+"$toolchain"} fuzz build "${flags[@]}" $opts "$t" >&2
done
echo "fuzz: built in $((SECONDS - start)) s" >&2

mkdir -p "$ROOT/target/fuzz-logs"
failed=0
summary=()
for t in "${run[@]}"; do
    corpus="$ROOT/target/fuzz-corpus/$t"
    artifacts="$ROOT/target/fuzz-artifacts/$t"
    log="$ROOT/target/fuzz-logs/$t.log"
    mkdir -p "$corpus" "$artifacts"
    dirs=("$corpus")
    [ -d "$FUZZ_DIR/corpus/$t" ] && dirs+=("$FUZZ_DIR/corpus/$t")
    echo "fuzz: $t for ${secs}s" >&2
    opts=$(target_opts "$t")
    tdir=$(target_dir "$t")
    jobs=${FUZZ_JOBS:-$(target_jobs "$t")}
    [[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz: FUZZ_JOBS must be a positive number, not '$jobs'" >&2; exit 2; }
    # One worker runs in the fuzz directory and logs to $log; several (libFuzzer's
    # -jobs/-workers) write fuzz-<i>.log in the directory they start in, one per target.
    if [ "$jobs" -le 1 ]; then
        wdir="$FUZZ_DIR" workers=() runs=${FUZZ_RUNS:-}
    else
        wdir="$ROOT/target/fuzz-logs/$t"
        rm -rf "$wdir" && mkdir -p "$wdir"
        workers=(-jobs="$jobs" -workers="$jobs") runs=${FUZZ_RUNS:+$((FUZZ_RUNS / jobs + 1))}
    fi
    set +e
    t0=$SECONDS
    # shellcheck disable=SC2086 # the options are words
    (cd "$wdir" && CARGO_TARGET_DIR=$tdir cargo ${toolchain:+"$toolchain"} fuzz run --fuzz-dir "$FUZZ_DIR" "${flags[@]}" $opts "$t" "${dirs[@]}" -- \
        "${workers[@]}" -max_total_time="$secs" ${runs:+-runs="$runs"} -print_final_stats=1 -artifact_prefix="$artifacts/" \
        -timeout="${FUZZ_TIMEOUT:-20}" -rss_limit_mb="${FUZZ_RSS_MB:-2048}") >"$log" 2>&1
    rc=$?
    logs=("$log")
    if [ "$jobs" -gt 1 ]; then
        logs=("$wdir"/fuzz-*.log)
        # A worker that crashed fails the target even if the parent said nothing.
        if [ $rc -eq 0 ] && grep -lqE "ERROR: libFuzzer|panicked at|Test unit written to" "${logs[@]}" 2>/dev/null; then
            rc=1
        fi
        cat "${logs[@]}" >>"$log" 2>/dev/null
    fi
    took=$((SECONDS - t0))
    set -e
    execs=
    for l in "${logs[@]}"; do
        n=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$l" | tail -1 | grep -oE '[0-9]+$' || true)
        if [ -z "$n" ]; then
            n=$(grep -oE '^#[0-9]+[[:space:]]+DONE' "$l" | tail -1 | grep -oE '[0-9]+' || true)
        fi
        [ -n "$n" ] && execs=$((${execs:-0} + n))
    done
    execs=${execs:-?}
    if [ $rc -ne 0 ]; then
        failed=$((failed + 1))
        repro=$(grep -oE '(Test unit written to|artifact_prefix.*Test unit written to) [^ ]+' "$log" | tail -1 | awk '{print $NF}' || true)
        summary+=("$(printf '%-20s %12s execs in %4d s  CRASHED (exit %d)' "$t" "$execs" "$took" "$rc")")
        echo "fuzz: $t CRASHED (exit $rc); log: $log" >&2
        grep -m1 -A8 -E "panicked at|ERROR: libFuzzer|SUMMARY:" "$log" >&2 || tail -20 "$log" >&2
        if [ -n "$repro" ]; then
            echo "fuzz: reproducer: $repro" >&2
            echo "fuzz: replay:     (cd core/fuzz && CARGO_TARGET_DIR=$tdir ${RUSTC_BOOTSTRAP:+RUSTC_BOOTSTRAP=1 }cargo $toolchain fuzz run ${flags[*]} ${opts:+$opts }$t $repro)" >&2
            echo "fuzz: after fixing, keep it as a regression test (replayed by cargo test -p cairn-core fuzzing):" >&2
            echo "      cp $repro core/fuzz/corpus/$t/" >&2
        fi
    else
        summary+=("$(printf '%-20s %12s execs in %4d s  ok%s' "$t" "$execs" "$took" "$([ "$jobs" -gt 1 ] && echo " ($jobs workers)")")")
    fi
done

echo "fuzz: at most ${secs}s${FUZZ_RUNS:+ or $FUZZ_RUNS inputs} per target"
for line in "${summary[@]}"; do echo "  $line"; done
[ $failed -eq 0 ] || { echo "fuzz: $failed target(s) crashed" >&2; exit 1; }
