#!/usr/bin/env bash
# Unaligned against aligned checkpoints under backpressure (issue 19, point 4).
#
#   bench/weir/backpressure.sh [N]      (default N=2000000)
#
# backpressure.yaml: W1-style orders, parallelism 2, a keyed running total (`reduce`, emit
# updates: one output per record), then a throttled last operator (a Rhai map spinning SPIN
# iterations per record, in its own task behind a rebalance exchange), so every channel stays
# full; exactly-once checkpoints every INTERVAL on the memory backend. Runs `aligned` and
# `unaligned` (aligned_timeout 0) alternately, RUNS times each, and reports per mode: the
# checkpoint durations (trigger to completion, from the "Checkpoint statistics." log lines;
# median and p95 over every checkpoint of its runs), how many checkpoints stored channel state
# and how much on average, and the throughput (input records over the wall time of the run).
# Target (issue 19): unaligned median <= 1/5 of aligned, throughput within 10 %.
#
# Every run's output is checked: one line per input record, and every user's final total equal
# to the first run's (both modes must produce the same result).
#
# Runs get WORKERS worker threads (default 8, more than the 6 tasks): with one per core, the
# spinning throttle tasks would starve the upstream tasks of their thread, the queues would run
# dry and no backpressure would build up.
#
# Env: WORK (/tmp/weirbench/backpressure), RUNS (2), SPIN (150), INTERVAL (1s), WORKERS (8), INPUT (default:
# the first N lines of /tmp/weirbench/n2000000.jsonl when it has enough, else generated with
# shared/bench/gen.py), SKIP_BUILD (set: use the weir already in $CARGO_TARGET_DIR/release).
# A short trial: `RUNS=1 bench/weir/backpressure.sh 200000`.
set -euo pipefail
N=${1:-2000000}
WORK=${WORK:-/tmp/weirbench/backpressure}
RUNS=${RUNS:-2}
SPIN=${SPIN:-150}
INTERVAL=${INTERVAL:-1s}
WORKERS=${WORKERS:-8}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SHARED=$ROOT/../shared/bench
[ -f "$SHARED/gen.py" ] || SHARED=/work/shared/bench
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
mkdir -p "$WORK"

[ -n "${SKIP_BUILD:-}" ] || (cd "$ROOT" && cargo build --release -q --bin weir)
WEIR=$TARGET/release/weir

if [ -z "${INPUT:-}" ]; then
  INPUT=$WORK/n$N.jsonl
  if [ ! -s "$INPUT" ]; then
    BIG=/tmp/weirbench/n2000000.jsonl
    if [ -s "$BIG" ] && [ "$N" -le 2000000 ]; then
      head -n "$N" "$BIG" > "$INPUT"
    else
      python3 "$SHARED/gen.py" "$N" "$INPUT"
    fi
  fi
fi
RECORDS=$(wc -l < "$INPUT")

# run MODE K: one run of the pipeline in $WORK/MODE-K; appends durations to $WORK/MODE.durations
# and one line "wall channel_checkpoints channel_bytes_total" to $WORK/MODE.runs.
run() {
  local mode=$1 k=$2 dir=$WORK/$1-$2 unaligned=false
  [ "$mode" = unaligned ] && unaligned=true
  rm -rf "$dir" && mkdir -p "$dir"
  ln -s "$INPUT" "$dir/input.jsonl"
  sed -e "s/INTERVAL/$INTERVAL/" -e "s/UNALIGNED/$unaligned/" -e "s/ALIGNED_TIMEOUT/0ms/" \
    -e "s/SPIN/$SPIN/" "$HERE/backpressure.yaml" > "$dir/bp.yaml"
  if [ "$mode" = aligned ]; then
    # `aligned_timeout` belongs to unaligned checkpoints only.
    sed -i '/aligned_timeout:/d' "$dir/bp.yaml"
  fi
  local t0 t1
  t0=$(date +%s.%N)
  (cd "$dir" && "$WEIR" run --no-progress --no-api --workers "$WORKERS" --log-format json --log-level debug bp.yaml \
    > run.out 2> run.log)
  t1=$(date +%s.%N)
  python3 - "$dir" "$RECORDS" "$t0" "$t1" "$WORK/$mode" <<'PY'
import json, pathlib, re, sys
d, records, t0, t1, out = pathlib.Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
def ms(text):
    m = re.fullmatch(r"(\d+)ms", text)
    if m: return float(m[1])
    m = re.fullmatch(r"([\d.]+)s", text)
    if m: return float(m[1]) * 1e3
    m = re.fullmatch(r"(\d+)m(\d+)s", text)
    if m: return (int(m[1]) * 60 + int(m[2])) * 1e3
    raise ValueError(text)
def size(text):
    n, _, unit = text.partition(" ")
    return float(n) * {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}[unit]
durations, channel = [], []
for line in (d / "run.log").read_text().splitlines():
    try:
        obj = json.loads(line)
    except ValueError:
        continue
    f = obj.get("fields", obj)
    if f.get("message") != "Checkpoint statistics.":
        continue
    durations.append(ms(f["duration"]))
    c = size(f.get("channel_state", "0 B"))
    if c > 0:
        channel.append(c)
lines = sum(1 for p in (d / "out").rglob("*") if p.is_file() and not p.name.startswith(".")
            for _ in p.open())
if lines != records:
    sys.exit(f"{d}: {lines} output lines for {records} records")
with open(out + ".durations", "a") as fh:
    fh.writelines(f"{x}\n" for x in durations)
with open(out + ".runs", "a") as fh:
    fh.write(f"{float(t1) - float(t0)} {len(channel)} {sum(channel)}\n")
PY
  # Same result in both modes: each user's last running total (its largest, amounts are
  # positive) equals the first run's. (The order of one user's records between the two file
  # readers varies from run to run, so the intermediate totals may differ.)
  local digest
  digest=$(find "$dir/out" -type f ! -name '.*' -exec cat {} + | python3 -c '
import json, sys
best = {}
for line in sys.stdin:
    r = json.loads(line)
    best[r["user"]] = max(best.get(r["user"], 0), r["amount"])
print(sorted(best.items()))' | md5sum | cut -d' ' -f1)
  if [ ! -s "$WORK/digest" ]; then echo "$digest" > "$WORK/digest"; fi
  if [ "$digest" != "$(cat "$WORK/digest")" ]; then
    echo "$dir: per-user totals differ from the first run's" >&2
    exit 1
  fi
  echo "  $mode run $k: $(tail -n 1 "$WORK/$mode.runs" | cut -d' ' -f1)s"
}

rm -f "$WORK"/*.durations "$WORK"/*.runs "$WORK/digest"
echo "N=$RECORDS records, SPIN=$SPIN, checkpoints every $INTERVAL, RUNS=$RUNS, load: $(cut -d' ' -f1-3 /proc/loadavg)"
for k in $(seq 1 "$RUNS"); do
  run aligned "$k"
  run unaligned "$k"
done

python3 - "$WORK" "$RECORDS" <<'PY'
import pathlib, statistics, sys
work, records = pathlib.Path(sys.argv[1]), int(sys.argv[2])
def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p * (len(xs) - 1)))] if xs else float("nan")
rows = {}
for mode in ("aligned", "unaligned"):
    d = [float(x) for x in (work / f"{mode}.durations").read_text().split()] if (work / f"{mode}.durations").exists() else []
    runs = [l.split() for l in (work / f"{mode}.runs").read_text().splitlines()]
    walls = [float(r[0]) for r in runs]
    with_channel = sum(int(r[1]) for r in runs)
    channel_bytes = sum(float(r[2]) for r in runs)
    rows[mode] = (d, statistics.median(walls))
    print(f"{mode:9} checkpoints {len(d):3}  duration median {statistics.median(d) if d else float('nan'):8.0f} ms"
          f"  p95 {pct(d, 0.95):8.0f} ms  throughput {records / statistics.median(walls):10.0f} rec/s"
          f"  with channel state {with_channel} ({channel_bytes / max(with_channel, 1) / 1024:.0f} KiB on average)")
(a, aw), (u, uw) = rows["aligned"], rows["unaligned"]
if a and u:
    print(f"unaligned/aligned: duration median {statistics.median(u) / statistics.median(a):.2f} (target <= 0.20),"
          f" throughput {aw / uw:.2f} (target 0.90..1.10)")
PY
