#!/usr/bin/env bash
# Long fuzz run of Weir's hostile-input boundaries (not in CI; CI runs the short seeded test in
# fuzz/tests/seeded.rs). Builds `weir-fuzz` in release mode and runs every target (or
# $TARGETS) for $INPUTS inputs each, split over $JOBS processes with disjoint input ranges.
#
# Every input runs on a thread with a 2 MiB stack (tokio's blocking threads, where `weir run`
# validates reloaded files), under a per-input timeout ($TIMEOUT s: a slower input is a hang
# and stops that process) and a per-input peak-RSS check ($MAX_RSS_MIB). Each process also
# runs under `ulimit -v` ($VMEM_GIB GiB), so that a runaway allocation fails instead of
# swapping. A process that dies (stack overflow, abort, failed allocation, signal) leaves the
# input it was running in $FINDINGS/current-TARGET-PID.input; the script keeps it as a
# finding. Any input replays with:
#   weir-fuzz --target TARGET --seed SEED --skip INDEX --inputs 1
#
# The `api` target is the control API's property test (engine/src/api/fuzz.rs) run for
# $INPUTS requests through the real router, in one process (a failure prints the seed that
# replays it).
#
# Usage: scripts/fuzz.sh            (1 000 000 inputs per target, 2 processes)
#        INPUTS=20000 SEED=7 TARGETS=savepoint scripts/fuzz.sh
# Exit status: 0 when nothing was found, 1 otherwise.
set -uo pipefail

cd "$(dirname "$0")/.."
INPUTS=${INPUTS:-1000000}
JOBS=${JOBS:-2}
SEED=${SEED:-$(date +%s)}
TIMEOUT=${TIMEOUT:-10}
MAX_RSS_MIB=${MAX_RSS_MIB:-1024}
VMEM_GIB=${VMEM_GIB:-8}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
FINDINGS=${FINDINGS:-$TARGET_DIR/fuzz-findings/seed-$SEED}

cargo build --release -p weir-fuzz --bin weir-fuzz >&2 || exit 2
BIN="$TARGET_DIR/release/weir-fuzz"
TARGETS=${TARGETS:-$("$BIN" --list) api}
mkdir -p "$FINDINGS"
LOGS="$FINDINGS/logs"
mkdir -p "$LOGS"

start=$(date +%s)
status=0
total=0
for target in $TARGETS; do
    if [[ $target == api ]]; then
        log="$LOGS/api.err"
        if WEIR_API_FUZZ_CASES=$INPUTS WEIR_API_FUZZ_SEED=$SEED cargo test -q --release \
            -p weir-engine --lib api::fuzz::any_request -- --nocapture >"$LOGS/api.out" 2>"$log"; then
            grep -i "cases\|requests" "$log" | tail -n1
            total=$(( total + INPUTS ))
        else
            status=1
            cp "$log" "$FINDINGS/api-failed.input"
            echo "api: the property test failed; its output is in $FINDINGS/api-failed.input" >&2
        fi
        continue
    fi
    per=$(( (INPUTS + JOBS - 1) / JOBS ))
    pids=()
    for ((j = 0; j < JOBS; j++)); do
        skip=$(( j * per ))
        count=$(( INPUTS - skip < per ? INPUTS - skip : per ))
        (( count > 0 )) || continue
        (
            ulimit -v $(( VMEM_GIB * 1024 * 1024 ))
            exec "$BIN" --target "$target" --seed "$SEED" --skip "$skip" --inputs "$count" \
                --timeout-secs "$TIMEOUT" --max-rss-mib "$MAX_RSS_MIB" \
                --findings "$FINDINGS" --progress 100000
        ) >"$LOGS/$target-$j.out" 2>"$LOGS/$target-$j.err" &
        pids+=("$!")
    done
    for pid in "${pids[@]}"; do
        wait "$pid"
        code=$?
        if [[ $code -ne 0 ]]; then
            status=1
            left="$FINDINGS/current-$target-$pid.input"
            if [[ -f $left ]]; then
                mv "$left" "$FINDINGS/$target-died-exit$code-pid$pid.input"
                echo "$target: process $pid died (exit $code); its input is in $FINDINGS/$target-died-exit$code-pid$pid.input" >&2
            fi
        fi
    done
    for ((j = 0; j < JOBS; j++)); do
        [[ -f $LOGS/$target-$j.out ]] || continue
        cat "$LOGS/$target-$j.out"
        ran=$(sed -n 's/.*: ran \([0-9]*\) in .*/\1/p' "$LOGS/$target-$j.out" | head -n1)
        total=$(( total + ${ran:-0} ))
    done
done
elapsed=$(( $(date +%s) - start ))
found=$(find "$FINDINGS" -maxdepth 1 -name '*.input' | wc -l)
echo "seed $SEED: $total inputs in ${elapsed} s, $found findings (in $FINDINGS)"
if [[ $found -ne 0 ]]; then status=1; fi
exit $status
