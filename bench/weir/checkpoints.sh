#!/usr/bin/env bash
# Checkpoint overhead and crash recovery (issue 4), against Flink in the same sitting.
#
#   bench/weir/checkpoints.sh [N]      (default N=10000000)
#
# 1. W1 built-in at N records, parallelism 2, file source and sink, with no checkpoints and with
#    exactly-once checkpoints every 1 s on the memory, fs and rocksdb (incremental) backends,
#    plus rocksdb with full (non-incremental) checkpoints. Flink W1 (HashMap and incremental
#    RocksDB, exactly-once checkpoints every 1 s, see shared/bench/flink/PeerJob.java) runs
#    interleaved with Weir's runs on the same input.
# 2. Recovery: W1 on rocksdb with ~RUSERS distinct users, killed with SIGKILL once at least two
#    checkpoints completed, then restarted on the same file (not --fresh); reports the time until
#    every operator processes again, the time to the first record and the restart's peak RSS
#    (target < 256 MiB at 1 M users, issue 19), and checks the output. Only this part:
#    PARTS=recovery FLINK=0 bench/weir/checkpoints.sh
#
# Every output is checked with shared/bench/check.py. Before each run the script waits (at most
# MAXWAIT s) for the 1-minute load average to fall to LOADMAX or below and records the load.
#
# Env: WORK (/tmp/weirbench/ckpt), RUNS (2), INPUT (default /tmp/peerbench/n10m.jsonl when
# N=10000000 and present, else $WORK/n$N.jsonl, generated), FLINK (1; 0 skips Flink),
# PARTS ("throughput recovery"), RN (3000000) and RUSERS (1000000): records and users of the
# recovery input (3 M draws over 1 M users: ~950 000 distinct), RECOVERY_RUNS (2), KILL_AFTER (0:
# also wait this many seconds before the kill, so that the checkpoint holds more keys), LOADMAX (1.5), MAXWAIT (240), PEER_VENVS as for the peers,
# ONLY (labels to run, e.g. "heap-off memory fs flink-hashmap"; default all),
# SKIP_BUILD (set: use the binaries already in $CARGO_TARGET_DIR/release).
set -euo pipefail
N=${1:-10000000}
WORK=${WORK:-/tmp/weirbench/ckpt}
RUNS=${RUNS:-2}
FLINK=${FLINK:-1}
PARTS=${PARTS:-throughput recovery}
RN=${RN:-3000000}
RUSERS=${RUSERS:-1000000}
RECOVERY_RUNS=${RECOVERY_RUNS:-2}
KILL_AFTER=${KILL_AFTER:-0}
LOADMAX=${LOADMAX:-1.5}
MAXWAIT=${MAXWAIT:-240}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SHARED=$ROOT/../shared/bench
[ -f "$SHARED/check.py" ] || SHARED=/work/shared/bench
CHECK=$SHARED/check.py
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
export PEER_VENVS=${PEER_VENVS:-$HOME/.cache/weir-peers}
mkdir -p "$WORK"
RESULTS=$WORK/results.tsv
: > "$RESULTS"

[ -n "${SKIP_BUILD:-}" ] ||
  (cd "$ROOT" && cargo build --release -q --bin weir && cargo build --release -q -p weir-engine --example bench_gen)
WEIR=$TARGET/release/weir
GEN=$TARGET/release/examples/bench_gen

if [ -z "${INPUT:-}" ]; then
  INPUT=$WORK/n$N.jsonl
  [ "$N" = 10000000 ] && [ -s /tmp/peerbench/n10m.jsonl ] && [ -s /tmp/peerbench/n10m.expected.json ] &&
    INPUT=/tmp/peerbench/n10m.jsonl
fi
EXPECTED=${INPUT%.jsonl}.expected.json
if [[ " $PARTS " == *" throughput "* ]] && { [ ! -s "$INPUT" ] || [ ! -s "$EXPECTED" ]; }; then
  echo "generating $N records into $INPUT"
  "$GEN" "$N" "$INPUT"
fi
if [ "$FLINK" = 1 ] && [ ! -d /tmp/peerbench/flink-classes ]; then
  bash "$SHARED/flink/run.sh" build
fi

. "$HERE/load.sh"

# Writes DIR/pipeline.yaml from w1_ckpt.yaml: STATE is the `state:` mapping, ENABLED true|false.
pipeline() {
  local dir=$1 state=$2 enabled=$3 input=$4
  mkdir -p "$dir"
  sed -e "s#^    state: { backend: memory }\$#    state: $state#" \
      -e "s#^      enabled: true\$#      enabled: $enabled#" \
      -e "s#path: input.jsonl#path: $input#" "$HERE/w1_ckpt.yaml" > "$dir/pipeline.yaml"
  grep -q "state: $state" "$dir/pipeline.yaml" && grep -q "enabled: $enabled" "$dir/pipeline.yaml"
}

# Checkpoint figures from a Weir log: count, median duration (ms), median size, median new bytes.
ckpt_stats() {
  python3 - "$1" <<'EOF'
import re, statistics, sys
rows = [tuple(map(int, m.groups())) for m in re.finditer(
    r"checkpoint=(\d+) duration_ms=(\d+) size_bytes=(\d+) new_bytes=(\d+)", open(sys.argv[1]).read())]
if not rows:
    print("0 - - -")
else:
    med = lambda i: statistics.median(r[i] for r in rows)
    print(len(rows), f"{med(1):g}", f"{med(2):.0f}", f"{med(3):.0f}")
EOF
}

STATES_memory='{ backend: memory }'
STATES_fs='{ backend: fs }'
STATES_rocksdb='{ backend: rocksdb, incremental: true }'
STATES_rocksdbfull='{ backend: rocksdb, incremental: false }'

# One Weir throughput run: LABEL STATE ENABLED ROUND
weir_run() {
  [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]] || return 0
  local label=$1 state=$2 enabled=$3 round=$4 dir=$WORK/$1
  rm -rf "$dir"
  pipeline "$dir" "$state" "$enabled" "$INPUT"
  local load; load=$(wait_load)
  echo "[$(date +%T)] $label run $round, uptime:$(uptime | sed 's/.*load average:/ load average:/')"
  RUST_LOG=info /usr/bin/time -o "$dir/time" -f "%e %M" "$WEIR" run --fresh --no-progress "$dir/pipeline.yaml" \
    > "$dir/stdout" 2> "$dir/log" || { tail -n 30 "$dir/log"; echo "FAILED: $label"; return 1; }
  local wall kib; read -r wall kib < "$dir/time"
  local verdict; verdict=$(python3 "$CHECK" w1 "$dir/out" "$EXPECTED" || true)
  local ck; ck=$(ckpt_stats "$dir/log" | tr ' ' '\t')
  cp "$dir/log" "$WORK/log.$label.r$round"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$round" "$load" "$wall" "$kib" "$ck" "$verdict" >> "$RESULTS"
  echo "  $label: ${wall}s, $((kib / 1024)) MiB, checkpoints/median ms/size/new: $ck; $verdict"
}

# One Flink run: BACKEND ROUND
flink_run() {
  [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" flink-$1 "* ]] || return 0
  local backend=$1 round=$2 label=flink-$1 dir=$WORK/flink-$1
  rm -rf "$dir"; mkdir -p "$dir"
  local load; load=$(wait_load)
  echo "[$(date +%T)] $label run $round, uptime:$(uptime | sed 's/.*load average:/ load average:/')"
  /usr/bin/time -o "$dir/time" -f "%e %M" bash "$SHARED/flink/run.sh" w1 "$backend" "$INPUT" "$dir/out" \
    > "$dir/log" 2>&1 || { tail -n 30 "$dir/log"; echo "FAILED: $label"; return 1; }
  local wall kib; read -r wall kib < "$dir/time"
  local verdict; verdict=$(python3 "$CHECK" w1 "$dir/out" "$EXPECTED" || true)
  cp "$dir/log" "$WORK/log.$label.r$round"
  printf '%s\t%s\t%s\t%s\t%s\t-\t-\t-\t-\t%s\n' "$label" "$round" "$load" "$wall" "$kib" "$verdict" >> "$RESULTS"
  echo "  $label: ${wall}s, $((kib / 1024)) MiB; $(grep -o 'job_net_runtime_ms=[0-9]*' "$dir/log" || true); $verdict"
}

if [[ " $PARTS " == *" throughput "* ]]; then
  echo "== 1. W1 at N=$N ($INPUT), parallelism 2, $RUNS round(s), interleaved with Flink"
  for r in $(seq "$RUNS"); do
    weir_run heap-off "$STATES_memory" false "$r" || true
    weir_run memory "$STATES_memory" true "$r" || true
    [ "$FLINK" = 1 ] && flink_run hashmap "$r" || true
    weir_run fs "$STATES_fs" true "$r" || true
    weir_run rocksdb-off "$STATES_rocksdb" false "$r" || true
    weir_run rocksdb "$STATES_rocksdb" true "$r" || true
    [ "$FLINK" = 1 ] && flink_run rocksdb "$r" || true
    weir_run rocksdb-full "$STATES_rocksdbfull" true "$r" || true
  done
fi

if [[ " $PARTS " == *" recovery "* ]]; then
  RIN=$WORK/n${RN}_u${RUSERS}.jsonl
  REXP=${RIN%.jsonl}.expected.json
  if [ ! -s "$RIN" ] || [ ! -s "$REXP" ]; then
    echo "generating $RN records over $RUSERS users into $RIN"
    "$GEN" "$RN" "$RIN" 42 "$RUSERS"
  fi
  echo "== 2. Recovery after SIGKILL: rocksdb (incremental), $RN records, $(python3 -c "import json; print(len(json.load(open('$REXP'))))") distinct users"
  for r in $(seq "$RECOVERY_RUNS"); do
    dir=$WORK/recovery
    rm -rf "$dir"
    pipeline "$dir" "$STATES_rocksdb" true "$RIN"
    load=$(wait_load)
    echo "[$(date +%T)] recovery run $r, uptime:$(uptime | sed 's/.*load average:/ load average:/')"
    : > "$dir/log1"
    t0=$(date +%s.%N)
    # "Checkpoint completed." is a debug line of the coordinator.
    RUST_LOG=info,weir_engine::checkpoint::coordinator=debug "$WEIR" run --fresh --no-progress "$dir/pipeline.yaml" > "$dir/stdout1" 2>> "$dir/log1" &
    pid=$!
    while kill -0 "$pid" 2> /dev/null && { [ "$(grep -c 'Checkpoint completed.' "$dir/log1" || true)" -lt 2 ] ||
        python3 -c "import sys, time; sys.exit(0 if time.time() - $t0 < $KILL_AFTER else 1)"; }; do
      sleep 0.05
    done
    if ! kill -9 "$pid" 2> /dev/null; then
      echo "  the first run ended before two checkpoints completed: nothing to recover"; tail -n 20 "$dir/log1"; exit 1
    fi
    wait "$pid" 2> /dev/null || true
    killed_after=$(python3 -c "import time; print(f'{time.time() - $t0:.2f}')")
    done_ck=$(grep -c 'Checkpoint completed.' "$dir/log1" || true)
    last_ck=$(grep 'Checkpoint completed.' "$dir/log1" | grep -o 'checkpoint=[0-9]*' | tail -n 1 | cut -d= -f2)
    ck1=$(ckpt_stats "$dir/log1")
    last_size=$(grep -o 'size_bytes=[0-9]*' "$dir/log1" | tail -n 1 | cut -d= -f2 || true)
    echo "  killed (SIGKILL) after ${killed_after}s, $done_ck checkpoints completed (last $last_ck; count/median ms/size/new: $ck1)"
    RUST_LOG=info /usr/bin/time -o "$dir/time" -f "%e %M" "$WEIR" run --no-progress "$dir/pipeline.yaml" \
      > "$dir/stdout2" 2> "$dir/log2" || { tail -n 30 "$dir/log2"; echo "FAILED: restart"; exit 1; }
    read -r wall kib < "$dir/time"
    resumed=$(grep -o 'resumed from checkpoint [0-9]*' "$dir/log2" | awk '{print $4}' || true)
    everywhere=$(grep -o 'every operator processing after [0-9.]*ms' "$dir/log2" | grep -o '[0-9.]*' || true)
    first=$(grep -o 'first record in [0-9.]*ms' "$dir/log2" | grep -o '[0-9.]*' || true)
    verdict=$(python3 "$CHECK" w1 "$dir/out" "$REXP" || true)
    cp "$dir/log1" "$WORK/log.recovery-killed.r$r"; cp "$dir/log2" "$WORK/log.recovery-restart.r$r"
    printf 'recovery\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$load" "$wall" "$kib" "$killed_after" \
      "$last_ck" "${resumed:--}" "${everywhere:--}" "${first:--}" "${last_size:--}" "$verdict" >> "$RESULTS"
    echo "  restart: resumed from checkpoint ${resumed:--}, processing everywhere after ${everywhere:--} ms," \
      "first record after ${first:--} ms, restart wall ${wall}s, $((kib / 1024)) MiB; $verdict"
  done
fi

# Summary: medians per configuration and the ratios the issue asks for.
python3 - "$RESULTS" "$N" <<'EOF'
import statistics as st, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
n = int(sys.argv[2])
med = lambda xs: st.median(xs) if xs else None
runs = {}
for r in rows:
    if r[0] != "recovery":
        runs.setdefault(r[0], []).append(r)
def num(x):
    try: return float(x)
    except ValueError: return None
if runs:
    print(f"\n1. W1, N = {n:,}, parallelism 2, medians of {max(len(v) for v in runs.values())} run(s)")
    print(f"{'config':<13} {'load':>10} {'wall s':>14} {'M rec/s':>8} {'RSS MiB':>8} {'ckpts':>6} {'med ms':>7} {'size/ckpt':>11} {'new/ckpt':>11}  check")
    rate = {}
    for label, rs in runs.items():
        walls = [float(r[3]) for r in rs]
        rate[label] = n / med(walls) / 1e6
        rss = med([int(r[4]) / 1024 for r in rs])
        def m(i):
            xs = [num(r[i]) for r in rs if num(r[i]) is not None]
            return med(xs)
        ck, dur, size, new = m(5), m(6), m(7), m(8)
        f = lambda v, fmt: "-" if v is None else format(v, fmt)
        ok = "all OK" if all(r[9].startswith("OK") for r in rs) else "FAIL: " + "; ".join(r[9] for r in rs if not r[9].startswith("OK"))
        print(f"{label:<13} {'/'.join(r[2] for r in rs):>10} {'/'.join(r[3] for r in rs):>14} {rate[label]:>8.3f} {rss:>8.0f} "
              f"{f(ck, '.0f'):>6} {f(dur, 'g'):>7} {f(size, ',.0f'):>11} {f(new, ',.0f'):>11}  {ok}")
    def ratio(a, b, target, what):
        if a in rate and b in rate:
            v = rate[a] / rate[b]
            print(f"  {what:<46} {v:6.2f}  target {target}: {'met' if v >= float(target.rstrip('x%')) / (100 if target.endswith('%') else 1) else 'MISSED'}")
    print("ratios (throughput):")
    ratio("memory", "heap-off", "90%", "memory checkpoints / no checkpoints")
    ratio("fs", "heap-off", "90%", "fs checkpoints / no checkpoints")
    ratio("rocksdb", "rocksdb-off", "90%", "rocksdb checkpoints / rocksdb no checkpoints")
    ratio("rocksdb-full", "rocksdb-off", "90%", "rocksdb full / rocksdb no checkpoints")
    ratio("rocksdb", "flink-rocksdb", "3x", "Weir rocksdb / Flink RocksDB")
    ratio("memory", "flink-hashmap", "2x", "Weir memory / Flink HashMap")
    ratio("fs", "flink-hashmap", "2x", "Weir fs / Flink HashMap")
rec = [r for r in rows if r[0] == "recovery"]
if rec:
    print("\n2. Recovery after SIGKILL (rocksdb, incremental)")
    print(f"{'run':>3} {'load':>5} {'killed at s':>11} {'last ckpt':>9} {'resumed':>7} {'everywhere ms':>13} {'first rec ms':>12} {'restart wall s':>14} {'RSS MiB':>8} {'restored B':>11}  check")
    for r in rec:
        print(f"{r[1]:>3} {r[2]:>5} {r[5]:>11} {r[6]:>9} {r[7]:>7} {r[8]:>13} {r[9]:>12} {r[3]:>14} {int(r[4]) // 1024:>8} {r[10]:>11}  {r[11]}")
    ev = [num(r[8]) for r in rec if num(r[8]) is not None]
    if ev:
        m = med(ev)
        print(f"  median processing everywhere after {m:g} ms; target <= 1000 ms: {'met' if m <= 1000 else 'MISSED'}")
    rss = [int(r[4]) / 1024 for r in rec]
    print(f"  restart peak RSS median {med(rss):.0f} MiB (max {max(rss):.0f}); target < 256 MiB (issue 19): "
          f"{'met' if max(rss) < 256 else 'MISSED'}")
EOF
