#!/usr/bin/env bash
# Weir's side of the peer benchmark (see shared/bench/README.md): generates the W1/W2 input
# with the Rust generator (same bytes as gen.py), runs W1 built-in, W1 with a Rhai reduce and
# W2 with a Rhai map at parallelism 1 and 2, prints records/s, peak RSS, the time to the first
# record out of a source and to every operator processing (both from the start of `weir run`),
# and checks every output with check.py.
#
#   bench/weir/run.sh [N]        (default N=10000000; WORK=/tmp/weirbench; RUNS=1)
set -euo pipefail
N=${1:-10000000}
WORK=${WORK:-/tmp/weirbench}
RUNS=${RUNS:-1}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CHECK=${CHECK:-$ROOT/../shared/bench/check.py}
[ -f "$CHECK" ] || CHECK=/work/shared/bench/check.py
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
mkdir -p "$WORK"

(cd "$ROOT" && cargo build --release -q --bin weir && cargo build --release -q -p weir-engine --example bench_gen)
WEIR=$TARGET/release/weir
GEN=$TARGET/release/examples/bench_gen

INPUT=$WORK/n$N.jsonl
if [ ! -s "$INPUT" ] || [ ! -s "$WORK/n$N.expected.json" ]; then
  echo "generating $N records into $INPUT"
  "$GEN" "$N" "$INPUT"
fi
if [ "$N" = 1000000 ]; then
  echo "md5 $(md5sum < "$INPUT" | cut -d' ' -f1) (gen.py: f6b842f6d2ffa9d2c8aa194b8f0a4a47)"
fi

printf '%-12s %3s %10s %12s %10s %12s %14s %s\n' workload par wall_s records/s peak_MiB first_rec all_processing check
for wl in w1_builtin w1_reduce w2_map; do
  case $wl in w2*) kind=w2 ;; *) kind=w1 ;; esac
  for p in 1 2; do
    dir=$WORK/$wl-p$p
    mkdir -p "$dir"
    sed -e "s/^    parallelism: 2$/    parallelism: $p/" -e "s#path: input.jsonl#path: $INPUT#" "$HERE/$wl.yaml" > "$dir/pipeline.yaml"
    for r in $(seq "$RUNS"); do
      /usr/bin/time -f "TIME %e %M" "$WEIR" run --no-progress "$dir/pipeline.yaml" > "$dir/stdout" 2> "$dir/log" || { cat "$dir/log"; exit 1; }
      read -r wall kib < <(grep '^TIME' "$dir/log" | awk '{print $2, $3}')
      first=$(grep -o 'first record in [0-9.]*ms' "$dir/log" | awk '{print $4}')
      processed=$(grep -o 'every operator processing after [0-9.]*ms' "$dir/log" | awk '{print $5}')
      verdict=$(python3 "$CHECK" "$kind" "$dir/out" "$WORK/n$N.expected.json" | cut -d' ' -f1)
      rps=$(python3 -c "print(f'{$N/$wall:,.0f}')")
      printf '%-12s %3s %10s %12s %10s %12s %14s %s\n' "$wl" "$p" "$wall" "$rps" "$((kib / 1024))" "$first" "$processed" "$verdict"
    done
  done
done
