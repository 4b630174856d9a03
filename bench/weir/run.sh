#!/usr/bin/env bash
# Weir's side of the peer benchmark (see shared/bench/README.md): generates the W1/W2 input
# with the Rust generator (same bytes as gen.py), runs W1 built-in, W1 with a Rhai reduce and
# W2 with a Rhai map at parallelism 1 and 2, prints records/s, peak RSS, the time to the first
# record out of a source and to every operator processing (both from the start of `weir run`),
# and checks every output with check.py.
#
#   bench/weir/run.sh [N]        (default N=10000000; WORK=/tmp/weirbench; RUNS=1;
#                                 ONLY="w1_builtin w2_map" to run a subset)
set -euo pipefail
N=${1:-10000000}
WORK=${WORK:-/tmp/weirbench}
RUNS=${RUNS:-1}
ONLY=${ONLY:-w1_builtin w1_reduce w2_map}
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

# Rounds are interleaved (every workload and parallelism once per round) so that a machine
# whose speed drifts affects them alike; the summary gives medians and, per parallelism, the
# median over rounds of W2's throughput divided by W1 built-in's (the issue's W2 >= 1/2 W1).
RESULTS=$WORK/run-results.tsv
: > "$RESULTS"
printf '%-5s %-12s %3s %10s %12s %10s %12s %14s %s\n' round workload par wall_s records/s peak_MiB first_rec all_processing check
for r in $(seq "$RUNS"); do
  for wl in $ONLY; do
    case $wl in w2*) kind=w2 ;; *) kind=w1 ;; esac
    for p in 1 2; do
      dir=$WORK/$wl-p$p
      mkdir -p "$dir"
      sed -e "s/^    parallelism: 2$/    parallelism: $p/" -e "s#path: input.jsonl#path: $INPUT#" "$HERE/$wl.yaml" > "$dir/pipeline.yaml"
      /usr/bin/time -f "TIME %e %M" "$WEIR" run --no-progress "$dir/pipeline.yaml" > "$dir/stdout" 2> "$dir/log" || { cat "$dir/log"; exit 1; }
      read -r wall kib < <(grep '^TIME' "$dir/log" | awk '{print $2, $3}')
      first=$(grep -o 'first record in [0-9.]*ms' "$dir/log" | awk '{print $4}')
      processed=$(grep -o 'every operator processing after [0-9.]*ms' "$dir/log" | awk '{print $5}')
      verdict=$(python3 "$CHECK" "$kind" "$dir/out" "$WORK/n$N.expected.json" | cut -d' ' -f1)
      rps=$(python3 -c "print(f'{$N/$wall:,.0f}')")
      printf '%-5s %-12s %3s %10s %12s %10s %12s %14s %s\n' "$r" "$wl" "$p" "$wall" "$rps" "$((kib / 1024))" "$first" "$processed" "$verdict"
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$wl" "$p" "$wall" "$kib" "$verdict" >> "$RESULTS"
    done
  done
done

python3 - "$RESULTS" "$N" <<'PY'
import statistics, sys
from collections import defaultdict
path, n = sys.argv[1], int(sys.argv[2])
walls, rss, rounds = defaultdict(list), defaultdict(list), defaultdict(dict)
for line in open(path):
    r, wl, p, wall, kib, verdict = line.rstrip("\n").split("\t")
    walls[wl, p].append(float(wall))
    rss[wl, p].append(int(kib) // 1024)
    rounds[r][wl, p] = float(wall)
print("\nmedians over %d round(s):" % len(rounds))
print("%-12s %3s %10s %12s %10s" % ("workload", "par", "wall_s", "records/s", "peak_MiB"))
for (wl, p), w in sorted(walls.items()):
    m = statistics.median(w)
    print("%-12s %3s %10.2f %12s %10d" % (wl, p, m, f"{n / m:,.0f}", max(rss[wl, p])))
for p in ("1", "2"):
    ratios = [rd["w1_builtin", p] / rd["w2_map", p] for rd in rounds.values()
              if ("w1_builtin", p) in rd and ("w2_map", p) in rd]
    if ratios:
        print("W2/W1 throughput at parallelism %s: median %.3f over %d round(s) (each: %s)"
              % (p, statistics.median(ratios), len(ratios), " ".join("%.3f" % x for x in ratios)))
PY
