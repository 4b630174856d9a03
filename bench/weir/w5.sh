#!/usr/bin/env bash
# W5 (issue 15): event-time tumbling windows on the W1 input, Weir and (optionally) the Flink
# peer in the same sitting, every output checked exact with shared/bench/w5/check5.py.
#
#   bench/weir/w5.sh [N]        (default N=10000000)
#
# Env: WORK (/tmp/weirbench/w5), RUNS (1), FLINK (1; 0 skips Flink, whose runs need the peer
# jars of PEER_VENVS as shared/bench/w5/run.sh says), BACKEND (hashmap: Flink's state backend),
# INPUT (default /tmp/peerbench/n10m.jsonl when N=10000000 and present, else $WORK/n$N.jsonl,
# generated with the Rust generator, byte-identical to gen.py), SKIP_BUILD (set: use the
# binaries already in $CARGO_TARGET_DIR/release).
# Prints, per run: wall seconds of the whole process, records/s, peak RSS and check5's verdict.
set -euo pipefail
N=${1:-10000000}
WORK=${WORK:-/tmp/weirbench/w5}
RUNS=${RUNS:-1}
FLINK=${FLINK:-1}
BACKEND=${BACKEND:-hashmap}
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
bench_paths w5/check5.py
CHECK=$SHARED/w5/check5.py
mkdir -p "$WORK"

bench_build
bench_input
if [ "$FLINK" = 1 ] && [ ! -d "${PEER_CLASSES:-/tmp/peerbench/flink-w5-classes}" ]; then
  bash "$SHARED/w5/run.sh" build
fi

printf '%-5s %-14s %10s %12s %10s  %s\n' round engine wall_s records/s peak_MiB check
for r in $(seq "$RUNS"); do
  dir=$WORK/weir
  rm -rf "$dir"
  mkdir -p "$dir"
  sed -e "s#path: input.jsonl#path: $INPUT#" "$HERE/w5.yaml" > "$dir/pipeline.yaml"
  grep -q "path: $INPUT" "$dir/pipeline.yaml"
  /usr/bin/time -f "TIME %e %M" "$WEIR" run --no-progress --no-api "$dir/pipeline.yaml" \
    > "$dir/stdout" 2> "$dir/log" || { tail -30 "$dir/log"; exit 1; }
  read -r wall kib < <(grep '^TIME' "$dir/log" | awk '{print $2, $3}')
  verdict=$(python3 "$CHECK" "$INPUT" "$dir/out")
  printf '%-5s %-14s %10s %12s %10s  %s\n' "$r" weir "$wall" \
    "$(python3 -c "print(f'{$N/$wall:,.0f}')")" "$((kib / 1024))" "$verdict"
  if [ "$FLINK" = 1 ]; then
    fdir=$WORK/flink
    mkdir -p "$fdir"
    /usr/bin/time -f "TIME %e %M" bash "$SHARED/w5/run.sh" "$BACKEND" "$INPUT" "$fdir/out" \
      > "$fdir/stdout" 2> "$fdir/log" || { tail -30 "$fdir/log"; exit 1; }
    read -r wall kib < <(grep '^TIME' "$fdir/log" | awk '{print $2, $3}')
    verdict=$(python3 "$CHECK" "$INPUT" "$fdir/out")
    printf '%-5s %-14s %10s %12s %10s  %s\n' "$r" "flink-$BACKEND" "$wall" \
      "$(python3 -c "print(f'{$N/$wall:,.0f}')")" "$((kib / 1024))" "$verdict"
  fi
done
