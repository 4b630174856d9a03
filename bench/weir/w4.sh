#!/usr/bin/env bash
# W4 (issue 19): scripted keyed state on the W1 input. Runs, alternating in every round, Weir on
# the original logic (shared/bench/w4/w4.yaml.in) and on the variant written with the
# read-modify-write state functions (bench/weir/w4_fast.yaml.in), each on the memory and the
# rocksdb backend, and (optionally) the Bytewax peer (shared/bench/w4/bw_w4.py, recovery on,
# 2 processes); every output is checked exact with shared/bench/w4/check4.py.
#
#   bench/weir/w4.sh [N]        (default N=10000000)
#
# Env: WORK (/tmp/weirbench/w4), RUNS (3), BYTEWAX (1; 0 skips it; its runs need the virtualenv
# of PEER_VENVS as shared/bench/README.md says), CONFIGS (the Weir rows to run, default
# "orig-memory orig-rocksdb fast-memory fast-rocksdb"; CONFIGS= runs Bytewax alone), INPUT (default /tmp/peerbench/n10m.jsonl
# when N=10000000 and present, else $WORK/n$N.jsonl, generated with the Rust generator,
# byte-identical to gen.py), SKIP_BUILD (set: use the binaries already in
# $CARGO_TARGET_DIR/release).
# Prints, per run: wall seconds of the whole process, CPU seconds (user+sys), records/s, peak
# RSS and check4's verdict; then the median wall, CPU and records/s of every row. Bytewax's CPU
# is that of all its processes; its peak RSS, as time(1) reports it, is its largest process's
# (the launcher and its 2 workers), not their sum. Bytewax's workers listen on localhost ports
# 2101 and 2102: run one Bytewax at a time on the machine.
set -euo pipefail
N=${1:-10000000}
WORK=${WORK:-/tmp/weirbench/w4}
RUNS=${RUNS:-3}
BYTEWAX=${BYTEWAX:-1}
CONFIGS=${CONFIGS-orig-memory orig-rocksdb fast-memory fast-rocksdb}
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
bench_paths w4/check4.py
CHECK=$SHARED/w4/check4.py
BWPY=$PEER_VENVS/.venv-bytewax/bin/python
mkdir -p "$WORK"

bench_build
bench_input
if [ "$BYTEWAX" = 1 ] && [ ! -x "$BWPY" ]; then
  echo "no Bytewax virtualenv at $BWPY (BYTEWAX=0 skips the peer)" >&2
  exit 1
fi

# One measured run: NAME DIR COMMAND...; appends "NAME wall cpu" to $WORK/results.
measure() {
  local name=$1 dir=$2
  shift 2
  /usr/bin/time -f "TIME %e %U %S %M" "$@" > "$dir/stdout" 2> "$dir/log" || { tail -30 "$dir/log"; exit 1; }
  read -r wall user sys kib < <(grep '^TIME' "$dir/log" | awk '{print $2, $3, $4, $5}')
  local cpu
  cpu=$(python3 -c "print(f'{$user + $sys:.2f}')")
  local verdict
  verdict=$(python3 "$CHECK" "$INPUT" "$dir/out")
  printf '%-5s %-14s %8s %8s %12s %9s  %s\n' "$r" "$name" "$wall" "$cpu" \
    "$(python3 -c "print(f'{$N/$wall:,.0f}')")" "$((kib / 1024))" "$verdict"
  echo "$name $wall $cpu" >> "$WORK/results"
}

: > "$WORK/results"
printf '%-5s %-14s %8s %8s %12s %9s  %s\n' round engine wall_s cpu_s records/s peak_MiB check
for r in $(seq "$RUNS"); do
  for config in $CONFIGS; do
    logic=${config%%-*}
    backend=${config#*-}
    case $logic in
      orig) template=$SHARED/w4/w4.yaml.in ;;
      fast) template=$HERE/w4_fast.yaml.in ;;
      *) echo "unknown config $config" >&2; exit 1 ;;
    esac
    dir=$WORK/$config
    bench_pipeline "$template" "$backend" "$dir"
    measure "weir-$config" "$dir" "$WEIR" run --no-progress --no-api "$dir/pipeline.yaml"
  done
  if [ "$BYTEWAX" = 1 ]; then
    dir=$WORK/bytewax
    bytewax_prepare "$dir"
    (cd "$SHARED/w4" && measure bytewax "$dir" "$BWPY" -m bytewax.testing \
      "bw_w4:get_flow('$INPUT', '$dir/out')" -p 2 -r "$dir/rec" -s 1 -b 0)
  fi
done

echo
echo "medians over $RUNS rounds:"
bench_medians "$WORK/results" "$N"
