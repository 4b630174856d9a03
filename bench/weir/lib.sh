# Set-up shared by the peer benchmark scripts (w4.sh, w5.sh); source it after setting N, WORK
# and HERE (the script's directory), then call:
#   bench_paths PROBE  sets ROOT, SHARED (../shared/bench beside the checkout when it holds
#                      PROBE, else /work/shared/bench), TARGET, WEIR and GEN; exports PEER_VENVS
#   bench_build        builds weir and the input generator, unless SKIP_BUILD is set
#   bench_input        sets INPUT, unless given: /tmp/peerbench/n10m.jsonl for N=10000000 when
#                      present, else $WORK/n$N.jsonl, generated when missing (the Rust
#                      generator, byte-identical to gen.py)
#   bench_pipeline TEMPLATE BACKEND DIR
#                      writes DIR/pipeline.yaml (DIR emptied first) from TEMPLATE with @STATE@
#                      the backend's settings (memory, or rocksdb incremental), @DIR@ and @INPUT@
#   bytewax_prepare DIR
#                      an empty DIR with Bytewax's recovery store for 2 partitions in DIR/rec
#                      and an empty DIR/out (its FileSink appends)
#   bench_medians RESULTS N
#                      prints, per engine of RESULTS (lines "engine wall_s cpu_s"), the median
#                      wall and CPU, records/s for N records, and the speed against Bytewax
#                      when RESULTS has Bytewax runs ("-" otherwise)

bench_paths() {
  ROOT=$(cd "$HERE/../.." && pwd)
  SHARED=$ROOT/../shared/bench
  [ -f "$SHARED/$1" ] || SHARED=/work/shared/bench
  TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
  WEIR=$TARGET/release/weir
  GEN=$TARGET/release/examples/bench_gen
  export PEER_VENVS=${PEER_VENVS:-$HOME/.cache/weir-peers}
}

bench_build() {
  [ -n "${SKIP_BUILD:-}" ] ||
    (cd "$ROOT" && cargo build --release -q --bin weir && cargo build --release -q -p weir-engine --example bench_gen)
}

bench_input() {
  if [ -z "${INPUT:-}" ]; then
    INPUT=$WORK/n$N.jsonl
    [ "$N" = 10000000 ] && [ -s /tmp/peerbench/n10m.jsonl ] && INPUT=/tmp/peerbench/n10m.jsonl
  fi
  if [ ! -s "$INPUT" ]; then
    echo "generating $N records into $INPUT"
    "$GEN" "$N" "$INPUT"
  fi
}

bench_pipeline() {
  local template=$1 backend=$2 dir=$3 state
  case $backend in
    memory) state='{ backend: memory }' ;;
    rocksdb) state='{ backend: rocksdb, incremental: true }' ;;
    *) echo "unknown backend $backend" >&2; exit 1 ;;
  esac
  rm -rf "$dir"
  mkdir -p "$dir"
  sed -e "s#@STATE@#$state#" -e "s#@DIR@#$dir#" -e "s#@INPUT@#$INPUT#" "$template" > "$dir/pipeline.yaml"
  grep -q "path: $INPUT" "$dir/pipeline.yaml"
}

bytewax_prepare() {
  rm -rf "$1"
  mkdir -p "$1/rec"
  : > "$1/out"
  "$BWPY" -m bytewax.recovery "$1/rec" 2 > /dev/null
}

bench_medians() {
  python3 - "$1" "$2" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, wall, cpu = line.split()
    rows.setdefault(name, []).append((float(wall), float(cpu)))
n = int(sys.argv[2])
bw = statistics.median(w for w, _ in rows["bytewax"]) if "bytewax" in rows else None
print(f"{'engine':<20} {'wall_s':>8} {'cpu_s':>8} {'records/s':>12}  vs Bytewax")
for name, runs in rows.items():
    wall = statistics.median(w for w, _ in runs)
    cpu = statistics.median(c for _, c in runs)
    ratio = f"{bw / wall:.2f}x" if bw else "-"
    print(f"{name:<20} {wall:8.2f} {cpu:8.2f} {n / wall:12,.0f}  {ratio}")
PY
}
