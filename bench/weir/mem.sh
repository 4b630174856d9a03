#!/usr/bin/env bash
# Memory with large keyed state (issue 19): a million users with map state. Weir (a Rhai
# `process` keeping one map state per user: counts per amount decile, `bench/weir/mem.yaml.in`)
# on the memory backend (and optionally rocksdb), against Bytewax 0.21 doing the same
# (`bench/weir/bw_mem.py`: fold_final with a dict per user, recovery on like
# shared/bench/bytewax/flow.py, 2 processes). Parallelism 2, exactly-once checkpoints every 1 s,
# one output record per user at end of input, every output checked with check_mem.py.
#
#   bench/weir/mem.sh [N] [USERS]      (defaults 4000000 records over 1000000 users: ~982 000 keys)
#
# Peak RSS is the peak of the summed RSS of the process and its children, sampled every 50 ms
# (peak_rss.py; Bytewax runs one process per worker), next to the largest single process's
# exact peak (getrusage). Prints every run and the medians over RUNS rounds (alternating).
#
# Env: WORK (/tmp/weirbench/mem), RUNS (3), BYTEWAX (1; 0 skips it), CONFIGS (Weir backends,
# default "memory"; add "rocksdb"), SKIP_BUILD (set: use the binaries in
# $CARGO_TARGET_DIR/release), PEER_VENVS as for the peers.
set -euo pipefail
N=${1:-4000000}
USERS=${2:-1000000}
WORK=${WORK:-/tmp/weirbench/mem}
RUNS=${RUNS:-3}
BYTEWAX=${BYTEWAX:-1}
CONFIGS=${CONFIGS:-memory}
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
ROOT=$(cd "$HERE/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
export PEER_VENVS=${PEER_VENVS:-$HOME/.cache/weir-peers}
BWPY=$PEER_VENVS/.venv-bytewax/bin/python
mkdir -p "$WORK"

[ -n "${SKIP_BUILD:-}" ] ||
  (cd "$ROOT" && cargo build --release -q --bin weir && cargo build --release -q -p weir-engine --example bench_gen)
WEIR=$TARGET/release/weir
GEN=$TARGET/release/examples/bench_gen

INPUT=$WORK/n${N}_u${USERS}.jsonl
if [ ! -s "$INPUT" ]; then
  echo "generating $N records over $USERS users into $INPUT"
  "$GEN" "$N" "$INPUT" 42 "$USERS"
fi
if [ "$BYTEWAX" = 1 ] && [ ! -x "$BWPY" ]; then
  echo "no Bytewax virtualenv at $BWPY (BYTEWAX=0 skips the peer)" >&2
  exit 1
fi

# One measured run: NAME DIR COMMAND...; appends "NAME summed_kib single_kib wall cpu".
measure() {
  local name=$1 dir=$2
  shift 2
  python3 "$HERE/peak_rss.py" "$dir/rss" "$@" > "$dir/stdout" 2> "$dir/log" || { tail -30 "$dir/log"; exit 1; }
  local sum one wall cpu
  read -r sum one wall cpu < "$dir/rss"
  local verdict
  verdict=$(python3 "$HERE/check_mem.py" "$INPUT" "$dir/out" || true)
  printf '%-5s %-16s %8s %8s %10s %10s  %s\n' "$r" "$name" "$wall" "$cpu" "$((sum / 1024))" "$((one / 1024))" "$verdict"
  echo "$name $sum $one $wall $cpu" >> "$WORK/results"
}

: > "$WORK/results"
printf '%-5s %-16s %8s %8s %10s %10s  %s\n' round engine wall_s cpu_s sum_MiB one_MiB check
for r in $(seq "$RUNS"); do
  for backend in $CONFIGS; do
    dir=$WORK/weir-$backend
    bench_pipeline "$HERE/mem.yaml.in" "$backend" "$dir"
    measure "weir-$backend" "$dir" "$WEIR" run --no-progress --no-api "$dir/pipeline.yaml"
  done
  if [ "$BYTEWAX" = 1 ]; then
    dir=$WORK/bytewax
    bytewax_prepare "$dir"
    (cd "$HERE" && measure bytewax "$dir" "$BWPY" -m bytewax.testing \
      "bw_mem:get_flow('$INPUT', '$dir/out')" -p 2 -r "$dir/rec" -s 1 -b 0)
  fi
done

echo
echo "medians over $RUNS rounds (peak RSS: summed over processes, and of the largest one):"
python3 - "$WORK/results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, s, one, wall, cpu = line.split()
    rows.setdefault(name, []).append((int(s) / 1024, int(one) / 1024, float(wall), float(cpu)))
med = lambda name, i: statistics.median(r[i] for r in rows[name])
bw = med("bytewax", 0) if "bytewax" in rows else None
print(f"{'engine':<16} {'sum_MiB':>8} {'one_MiB':>8} {'wall_s':>7} {'cpu_s':>7}  RSS / Bytewax")
for name in rows:
    ratio = f"{max(med(name, 0), med(name, 1)) / bw:.2f}" if bw else "-"
    print(f"{name:<16} {med(name, 0):8.0f} {med(name, 1):8.0f} {med(name, 2):7.2f} {med(name, 3):7.2f}  {ratio}")
PY
