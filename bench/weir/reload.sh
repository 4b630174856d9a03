#!/usr/bin/env bash
# Savepoint time and size, and the hot-reload pause (issue 5), per state backend and state size.
#
#   bench/weir/reload.sh
#
# For each backend (memory, fs, rocksdb incremental) and each state size K (10 000 and
# 1 000 000 keys), one `weir run --api-port 0` of a generated pipeline (written to
# $WORK/<backend>-<K>/pipeline.yaml):
#
#   fill (generator, count K, n = 0..K-1) ─┐
#                                          ├─► union ─► key_by n ─► totals (reduce: c += 1,
#   tail (generator, RATE/s, n < HOT)  ────┘        emits every update) ─► sample (n % SAMPLE == 0) ─► file
#
# so the reduce holds exactly K keys once `fill` is done, while `tail` keeps updating the HOT
# first keys at RATE records/s (HOT = min(K, TAIL_KEYS)). Exactly-once checkpoints every
# CKPT_INTERVAL. The script waits until a completed checkpoint no longer lists a `fill`
# subtask (the fill source finished before it was triggered, so every fill record is in the
# reduce's state), takes a savepoint with `weir savepoint` (time from the engine's log, size
# from `du -sb` and from the API), then reloads RUNS times with `weir reload`, alternating
# between two equivalent versions (CHANGE=script: `acc.c += r.c` vs `acc.c = acc.c + r.c`;
# CHANGE=parallelism: the keyed part alternates between PAR and PAR_ALT subtasks), and reads
# each reload's pause from its outcome (cross-checked with `weir status --json`). From the
# `weir run` log, each pause is split into the stop-savepoint (trigger to on disk: barrier,
# snapshot, write, copy into the savepoint directory), the teardown (savepoint on disk to the
# new version starting its restore: the old tasks ending) and start+restore (to the end of the
# pause: the new tasks opening and restoring their state). Then `weir stop`; the run must exit 0
# and the sampled output must show every sampled key with totals 1, 2, ..., m exactly once each
# (a reset total would repeat a value, a lost update would leave a gap) and some tail updates.
#
# Before each configuration the script waits (at most MAXWAIT s) for the 1-minute load average
# to fall to LOADMAX or below, and records the load at the savepoint and at every reload.
#
# Env: WORK (/tmp/weirbench/reload), BACKENDS ("memory fs rocksdb"), KEYS ("10000 1000000"),
# RUNS (3 reloads per configuration), CHANGE (script | parallelism), PAR (2), PAR_ALT (1 when
# PAR > 1, else 2), RATE (1000 tail records/s), TAIL_KEYS (1000), SAMPLE (100: keys kept by the
# sample filter, 1 in SAMPLE), CKPT_INTERVAL (5s), GAP (2 s between a reload and the next one,
# after the new version completed a checkpoint), FILL_TIMEOUT (900 s), LOADMAX (1.5),
# MAXWAIT (240), WEIR (the binary; default $CARGO_TARGET_DIR/release/weir, built first unless
# SKIP_BUILD is set or WEIR is given).
#
# $WORK/results.tsv, one row per configuration: build, backend, keys, load before, load at the
# savepoint, savepoint ms, savepoint bytes (du -sb), savepoint bytes (API), median pause ms, then
# comma-separated per reload: pauses, loads, stop-savepoint ms, teardown ms, start+restore ms;
# last the check's verdict. The logs stay in $WORK/log.<backend>-<keys>.
set -euo pipefail
WORK=${WORK:-/tmp/weirbench/reload}
BACKENDS=${BACKENDS:-memory fs rocksdb}
KEYS=${KEYS:-10000 1000000}
RUNS=${RUNS:-3}
CHANGE=${CHANGE:-script}
PAR=${PAR:-2}
if [ "$PAR" -gt 1 ]; then PAR_ALT=${PAR_ALT:-1}; else PAR_ALT=${PAR_ALT:-2}; fi
RATE=${RATE:-1000}
TAIL_KEYS=${TAIL_KEYS:-1000}
SAMPLE=${SAMPLE:-100}
CKPT_INTERVAL=${CKPT_INTERVAL:-5s}
GAP=${GAP:-2}
FILL_TIMEOUT=${FILL_TIMEOUT:-900}
LOADMAX=${LOADMAX:-1.5}
MAXWAIT=${MAXWAIT:-240}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
case $CHANGE in script | parallelism) ;; *) echo "CHANGE must be script or parallelism" >&2; exit 2 ;; esac
mkdir -p "$WORK"
RESULTS=$WORK/results.tsv
: > "$RESULTS"

if [ -z "${WEIR:-}" ]; then
  [ -n "${SKIP_BUILD:-}" ] || (cd "$ROOT" && cargo build --release -q --bin weir)
  WEIR=$TARGET/release/weir
fi
case $WEIR in */debug/*) BUILD=debug ;; *) BUILD=release ;; esac
"$WEIR" savepoint --help > /dev/null 2>&1 || { echo "$WEIR has no \`savepoint\` verb: rebuild it" >&2; exit 2; }
echo "binary: $WEIR ($BUILD)"

load1() { cut -d' ' -f1 /proc/loadavg; }
# Waits until the 1-minute load is at most LOADMAX (or MAXWAIT passed); prints the load seen.
wait_load() {
  local waited=0
  while python3 -c "import sys; sys.exit(0 if $(load1) > $LOADMAX else 1)" && [ "$waited" -lt "$MAXWAIT" ]; do
    sleep 5; waited=$((waited + 5))
  done
  local l; l=$(load1)
  if [ "$waited" -gt 0 ]; then
    echo "  (waited ${waited}s for load <= $LOADMAX; now $l)" >&2
  fi
  echo "$l"
}

STATES_memory='{ backend: memory }'
STATES_fs='{ backend: fs }'
STATES_rocksdb='{ backend: rocksdb, incremental: true }'

# Writes DIR/pipeline.yaml (atomically: `weir reload` re-reads it): BACKEND K VERSION (0 or 1).
pipeline() {
  local dir=$1 backend=$2 k=$3 version=$4
  local state_var=STATES_$backend hot=$((k < TAIL_KEYS ? k : TAIL_KEYS))
  local script='acc.c += r.c; acc' keyed_par=$PAR
  if [ "$version" = 1 ]; then
    if [ "$CHANGE" = script ]; then script='acc.c = acc.c + r.c; acc'; else keyed_par=$PAR_ALT; fi
  fi
  cat > "$dir/pipeline.yaml.tmp" <<EOF
# Generated by bench/weir/reload.sh (version $version of 2; CHANGE=$CHANGE).
version: 1
pipelines:
  - id: reload
    parallelism: $PAR
    state: ${!state_var}
    checkpoints:
      enabled: true
      mode: exactly_once
      interval: $CKPT_INTERVAL
      storage: ckpt
    sources:
      - id: fill
        type: generator
        count: $k
        fields:
          n: { kind: sequence }
          c: { kind: const, value: 1 }
      - id: tail
        type: generator
        seed: 7
        rate: $RATE
        fields:
          n: { kind: int, min: 0, max: $((hot - 1)) }
          c: { kind: const, value: 1 }
    operators:
      - { id: both, type: union, inputs: [fill, tail] }
      - { id: by_n, type: key_by, input: both, field: n }
      - id: totals
        type: reduce
        input: by_n
        parallelism: $keyed_par
        script: |
          fn reduce(acc, r) { $script }
      - id: sample
        type: filter
        input: totals
        parallelism: $keyed_par
        script: |
          fn filter(r) { r.n % $SAMPLE == 0 }
    sinks:
      - { id: out, type: file, input: sample, path: out, parallelism: $keyed_par }
EOF
  mv "$dir/pipeline.yaml.tmp" "$dir/pipeline.yaml"
}

# Prints "source_records checkpoints fill_done state" of pipeline `reload` from the API; fill_done
# is 1 when the latest completed checkpoint lists no `fill` subtask.
probe() {
  python3 - "$1" <<'EOF'
import json, sys, urllib.request
base = "http://" + sys.argv[1] + "/v1"
get = lambda p: json.load(urllib.request.urlopen(base + p, timeout=30))
try:
    p = next(p for p in get("/status")["pipelines"] if p["id"] == "reload")
    ck = [c for c in get("/pipelines/reload/checkpoints") if c["kind"] == "checkpoint"]
except Exception as e:  # not up yet, or restarting
    print("0 0 0 unreachable"); sys.exit(0)
done = bool(ck) and not any(s["task"].startswith("fill[") for s in ck[-1]["subtasks"])
print(p["source_records"], p["checkpoints"], int(done), p["state"])
EOF
}

# Splits the pause of the reload whose log lines start at byte OFFSET of LOG: prints
# "stop_savepoint_ms teardown_ms restore_ms" (see the header), or "- - -".
phases() {
  python3 - "$1" "$2" "$3" <<'EOF'
import re, sys
from datetime import datetime
log, off, pause = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(log, "rb") as f:
    f.seek(off)
    lines = f.read().decode(errors="replace").splitlines()
ts = lambda l: datetime.strptime(l.split()[0], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp() * 1000
t0 = written = sp_ms = restoring = None
for l in lines:
    if t0 is None and "Taking a savepoint." in l and "then=Stop" in l:
        t0 = ts(l)
    elif t0 is not None and written is None and "Savepoint written." in l:
        written, sp_ms = ts(l), int(re.search(r"duration_ms=(\d+)", l).group(1))
    elif written is not None and restoring is None and "Restoring from a savepoint." in l:
        restoring = ts(l)
if None in (t0, written, restoring):
    print("- - -")
else:
    print(sp_ms, round(restoring - written), round(t0 + pause - restoring))
EOF
}

# Checks the sampled output: every key n < K with n % SAMPLE == 0 present, its totals exactly
# 1..m once each, and some tail updates. Prints "OK ..." or "FAIL: ...".
check_out() {
  python3 - "$1" "$2" "$SAMPLE" <<'EOF'
import glob, json, os, sys
out, k, sample = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seen = {}
for f in glob.glob(os.path.join(out, "**", "*"), recursive=True):
    if os.path.isfile(f) and not os.path.basename(f).startswith("."):
        for line in open(f):
            if line.strip():
                r = json.loads(line)
                seen.setdefault(r["n"], []).append(r["c"])
want = set(range(0, k, sample))
bad = []
if set(seen) != want:
    bad.append(f"{len(want - set(seen))} sampled keys missing, {len(set(seen) - want)} unexpected")
for n, cs in seen.items():
    if sorted(cs) != list(range(1, len(cs) + 1)):
        dup = len(cs) - len(set(cs))
        bad.append(f"key {n}: totals {sorted(cs)[:12]}{'...' if len(cs) > 12 else ''} ({dup} repeated)")
        if len(bad) > 5:
            break
updates = sum(len(cs) for cs in seen.values())
if updates == len(seen):
    bad.append("no tail update reached the sample")
print(("FAIL: " + "; ".join(bad)) if bad else f"OK {len(seen)} keys, {updates} updates, max total {max(max(c) for c in seen.values())}")
EOF
}

# One configuration: BACKEND K.
bench() {
  local backend=$1 k=$2 dir=$WORK/$1-$2
  rm -rf "$dir"; mkdir -p "$dir"
  pipeline "$dir" "$backend" "$k" 0
  "$WEIR" validate "$dir/pipeline.yaml" > "$dir/validate" 2>&1 || { cat "$dir/validate"; return 1; }
  local load; load=$(wait_load)
  echo "[$(date +%T)] $backend, $k keys ($BUILD), uptime:$(uptime | sed 's/.*load average:/ load average:/')"
  (cd "$dir" && RUST_LOG=info exec "$WEIR" run pipeline.yaml --api-port 0 --no-progress > stdout 2> log) &
  local pid=$! addr="" t0 elapsed
  t0=$(date +%s)
  while [ -z "$addr" ] && kill -0 "$pid" 2> /dev/null; do
    addr=$(grep -o 'control API on http://[0-9.:]*' "$dir/log" | sed 's#.*http://##' || true)
    sleep 0.1
  done
  [ -n "$addr" ] || { tail -n 30 "$dir/log"; echo "FAILED: no API"; wait "$pid" || true; return 1; }
  # Wait for the fill to be in the reduce's state and in a completed checkpoint.
  local records ckpts done state
  while :; do
    read -r records ckpts done state < <(probe "$addr")
    [ "$done" = 1 ] && [ "$records" -ge "$k" ] && break
    elapsed=$(($(date +%s) - t0))
    if ! kill -0 "$pid" 2> /dev/null || [ "$elapsed" -gt "$FILL_TIMEOUT" ]; then
      tail -n 30 "$dir/log"; echo "FAILED: $backend $k: fill not done after ${elapsed}s ($records records, $state)"
      kill -TERM "$pid" 2> /dev/null || true; wait "$pid" || true; return 1
    fi
    sleep 0.5
  done
  echo "  filled: $records source records, $ckpts checkpoints after $(($(date +%s) - t0))s"

  # The savepoint, while the pipeline runs.
  local sp_load sp sp_ckpt sp_ms sp_api sp_du
  sp_load=$(load1)
  sp=$("$WEIR" savepoint reload --api "$addr" 2> "$dir/savepoint.err") || { cat "$dir/savepoint.err"; return 1; }
  sp_ckpt=$(grep -o 'taken as checkpoint [0-9]*' "$dir/savepoint.err" | awk '{print $4}')
  read -r sp_ms sp_api < <(grep "Savepoint written. .*checkpoint=$sp_ckpt " "$dir/log" |
    sed -E 's/.*size_bytes=([0-9]+) duration_ms=([0-9]+).*/\2 \1/')
  sp_du=$(du -sb "$sp" | cut -f1)
  echo "  savepoint: $sp_ms ms, $sp_du bytes (du), $sp_api bytes (API) — $(sed 's/^savepoint of //' "$dir/savepoint.err")"

  # The reloads.
  local i pauses="" loads="" sps="" tears="" restores="" off out pause spause ph problems=""
  for i in $(seq "$RUNS"); do
    loads+="${loads:+,}$(load1)"
    off=$(stat -c %s "$dir/log")
    pipeline "$dir" "$backend" "$k" $((i % 2))
    out=$("$WEIR" reload --api "$addr" 2>&1) || { echo "$out"; echo "FAILED: reload $i"; kill -TERM "$pid"; wait "$pid" || true; return 1; }
    echo "$out" > "$dir/reload.$i"
    pause=$(grep -o 'longest pause [0-9]*' <<< "$out" | awk '{print $3}')
    [ -n "$pause" ] || { echo "$out"; echo "FAILED: reload $i reports no pause"; kill -TERM "$pid"; wait "$pid" || true; return 1; }
    spause=$("$WEIR" status --json --api "$addr" | python3 -c 'import json, sys; print(json.load(sys.stdin)["last_reload"]["pause_ms"])')
    [ "$pause" = "$spause" ] || echo "  warning: reload $i: outcome says $pause ms, status says $spause ms"
    read -r -a ph < <(phases "$dir/log" "$off" "$pause")
    pauses+="${pauses:+,}$pause"; sps+="${sps:+,}${ph[0]}"; tears+="${tears:+,}${ph[1]}"; restores+="${restores:+,}${ph[2]}"
    echo "  reload $i: pause $pause ms (stop-savepoint ${ph[0]}, teardown ${ph[1]}, start+restore ${ph[2]} ms), load ${loads##*,}"
    # The new version runs and completed a checkpoint before the next reload.
    t0=$(date +%s)
    while :; do
      read -r records ckpts done state < <(probe "$addr")
      [ "$state" = running ] && [ "$ckpts" -ge 1 ] && break
      if [ $(($(date +%s) - t0)) -gt 120 ]; then problems+="no checkpoint after reload $i ($state); "; break; fi
      sleep 0.2
    done
    sleep "$GAP"
  done

  # Stop, then check.
  "$WEIR" stop reload --api "$addr" 2> "$dir/stop.err" || cat "$dir/stop.err"
  local rc=0
  wait "$pid" || rc=$?
  local verdict
  if [ "$rc" != 0 ]; then
    verdict="FAIL: weir run exited $rc"; tail -n 20 "$dir/log"
  else
    verdict=$(check_out "$dir/out" "$k")
  fi
  [ -z "$problems" ] || verdict="FAIL: $problems$verdict"
  local median
  median=$(python3 -c "import statistics; print(f'{statistics.median([$pauses]):g}')")
  cp "$dir/log" "$WORK/log.$backend-$k"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$BUILD" "$backend" "$k" "$load" "$sp_load" \
    "$sp_ms" "$sp_du" "$sp_api" "$median" "$pauses" "$loads" "$sps" "$tears" "$restores" "$verdict" >> "$RESULTS"
  echo "  median pause $median ms; $verdict"
}

echo "CHANGE=$CHANGE, PAR=$PAR$([ "$CHANGE" = parallelism ] && echo " <-> $PAR_ALT"), tail $RATE records/s over min(K, $TAIL_KEYS) keys," \
  "checkpoints every $CKPT_INTERVAL, $RUNS reloads per configuration"
for k in $KEYS; do
  for backend in $BACKENDS; do
    bench "$backend" "$k" || printf '%s\t%s\t%s\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\tFAIL: see above\n' "$BUILD" "$backend" "$k" >> "$RESULTS"
  done
done

# Summary.
python3 - "$RESULTS" "$LOADMAX" <<'EOF'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
loadmax = float(sys.argv[2])
target = {10000: 100, 1000000: 1000}
print(f"\n{'build':<7} {'backend':<8} {'keys':>9} {'sp ms':>6} {'sp bytes':>12} {'pause ms (median; all)':<26} "
      f"{'stop-savepoint / teardown / start+restore ms':<46} {'target':>11} {'load':<20}  check")
for r in rows:
    build, backend, k = r[0], r[1], int(r[2])
    if r[5] == "-":
        print(f"{build:<7} {backend:<8} {k:>9,}  failed: {r[14]}")
        continue
    loads = [float(x) for x in [r[4]] + r[10].split(",")]
    t = target.get(k)
    met = "-" if t is None else f"{'met' if float(r[8]) <= t else 'MISSED'} ≤{t}"
    split = " | ".join("/".join(x) for x in zip(r[11].split(","), r[12].split(","), r[13].split(",")))
    prov = " provisional" if max(loads) > loadmax else ""
    print(f"{build:<7} {backend:<8} {k:>9,} {r[5]:>6} {int(r[6]):>12,} {r[8] + '; ' + r[9]:<26} {split:<46} {met:>11} "
          f"{','.join(f'{x:g}' for x in loads):<20}{prov}  {r[14]}")
EOF
echo "results: $RESULTS"
