#!/usr/bin/env bash
# Parallel scaling of W4 as written (shared/bench/w4/w4.yaml.in, memory backend, exactly-once
# 1 s checkpoints): the same pipeline at parallelism 1 and 2, alternating, every output checked
# exact with shared/bench/w4/check4.py. Two subtasks of a CPU-bound chain should take about
# half the wall time of one, using two cores: this shows whether they do.
#
#   bench/weir/scaling.sh [N]        (default N=1000000)
#
# Env: WORK (/tmp/weirbench/scaling), RUNS (3), INPUT (default $WORK/n$N.jsonl, the first N
# lines of /tmp/weirbench/n2000000.jsonl when it has them, else generated with the Rust
# generator), WEIR_BIN (default $CARGO_TARGET_DIR/release/weir), SKIP_BUILD (set: use the binaries
# already built).
# Prints, per run: wall and CPU seconds (user+sys) of the whole process, cores used (CPU/wall)
# and check4's verdict; then per parallelism the medians and the speed-up of p=2 over p=1
# (wall). On a loaded machine the wall figures are noise; cores used still tells whether the
# two subtasks ran side by side (about 2.0) or took turns (about 1.0).
set -euo pipefail
N=${1:-1000000}
WORK=${WORK:-/tmp/weirbench/scaling}
RUNS=${RUNS:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
bench_paths w4/check4.py
WEIR=${WEIR_BIN:-$WEIR}
CHECK=$SHARED/w4/check4.py
mkdir -p "$WORK"

bench_build
if [ -z "${INPUT:-}" ]; then
  INPUT=$WORK/n$N.jsonl
  BIG=/tmp/weirbench/n2000000.jsonl
  if [ ! -s "$INPUT" ] && [ -s "$BIG" ] && [ "$N" -le 2000000 ]; then
    head -n "$N" "$BIG" > "$INPUT"
  fi
fi
bench_input

: > "$WORK/results"
printf '%-5s %-4s %8s %8s %6s  %s\n' round par wall_s cpu_s cores check
for r in $(seq "$RUNS"); do
  for p in 1 2; do
    dir=$WORK/p$p
    bench_pipeline "$SHARED/w4/w4.yaml.in" memory "$dir"
    sed -i -e "s#^    parallelism: 2\$#    parallelism: $p#" "$dir/pipeline.yaml"
    grep -q "^    parallelism: $p\$" "$dir/pipeline.yaml"
    /usr/bin/time -f "TIME %e %U %S" "$WEIR" run --no-progress --no-api "$dir/pipeline.yaml" \
      > "$dir/stdout" 2> "$dir/log" || { tail -30 "$dir/log"; exit 1; }
    read -r wall user sys < <(grep '^TIME' "$dir/log" | awk '{print $2, $3, $4}')
    cpu=$(python3 -c "print(f'{$user + $sys:.2f}')")
    verdict=$(python3 "$CHECK" "$INPUT" "$dir/out")
    printf '%-5s %-4s %8s %8s %6s  %s\n' "$r" "$p" "$wall" "$cpu" \
      "$(python3 -c "print(f'{$cpu / $wall:.2f}')")" "$verdict"
    echo "$p $wall $cpu" >> "$WORK/results"
  done
done

echo
echo "medians over $RUNS rounds:"
python3 - "$WORK/results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    p, wall, cpu = line.split()
    rows.setdefault(p, []).append((float(wall), float(cpu)))
med = {p: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r)) for p, r in rows.items()}
for p, (wall, cpu) in sorted(med.items()):
    print(f"p={p}: wall {wall:.2f} s, cpu {cpu:.2f} s, cores used {cpu / wall:.2f}")
if "1" in med and "2" in med:
    print(f"speed-up p=2 over p=1 (wall): {med['1'][0] / med['2'][0]:.2f}x")
PY
