#!/usr/bin/env bash
# Scripted keyed state beside W4 (issue 19: "other scripted state workloads ... will be
# measured too"), so that a gain is not tuned to W4 alone:
#   skew    W4's logic as written (shared/bench/w4/w4.yaml.in) on N records whose users follow a
#           Zipf-like law over N possible users (exponent 0.8: about 390 k distinct users in
#           1 M records, the hottest with 1.4 %), so most state is cold; checked with check4.py
#   fields  bench/weir/wfields.yaml.in: per user a map of 64 item sums read and written back
#           (map_get, map_put) and a count; checked with `wstate.py check-fields`
#   wide    the same pipeline on 50 users of 5000 items each: maps of thousands of fields
# each on the memory and the rocksdb backend, alternating in every round.
#
#   bench/weir/wstate.sh [N]        (default N=1000000)
#
# Env: WORK (/tmp/weirbench/wstate), RUNS (3), CONFIGS (default "skew-memory fields-memory
# wide-memory skew-rocksdb fields-rocksdb wide-rocksdb"), SKIP_BUILD (set: use the binaries already in
# $CARGO_TARGET_DIR/release). Inputs are written once to $WORK/{skew,fields,wide}$N.jsonl.
# Prints, per run: wall seconds, CPU seconds (user+sys), records/s, peak RSS and the check's
# verdict; then the median wall, CPU and records/s of every row.
set -euo pipefail
N=${1:-1000000}
WORK=${WORK:-/tmp/weirbench/wstate}
RUNS=${RUNS:-3}
CONFIGS=${CONFIGS-skew-memory fields-memory wide-memory skew-rocksdb fields-rocksdb wide-rocksdb}
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
bench_paths w4/check4.py
mkdir -p "$WORK"
bench_build
for kind in skew fields wide; do
  [ -s "$WORK/$kind$N.jsonl" ] || python3 "$HERE/wstate.py" "$kind" "$N" "$WORK/$kind$N.jsonl"
done

: > "$WORK/results"
printf '%-5s %-16s %8s %8s %12s %9s  %s\n' round engine wall_s cpu_s records/s peak_MiB check
for r in $(seq "$RUNS"); do
  for config in $CONFIGS; do
    kind=${config%%-*}
    backend=${config#*-}
    INPUT=$WORK/$kind$N.jsonl
    case $kind in
      skew) template=$SHARED/w4/w4.yaml.in ;;
      fields | wide) template=$HERE/wfields.yaml.in ;;
      *) echo "unknown config $config" >&2; exit 1 ;;
    esac
    dir=$WORK/$config
    bench_pipeline "$template" "$backend" "$dir"
    /usr/bin/time -f "TIME %e %U %S %M" "$WEIR" run --no-progress --no-api "$dir/pipeline.yaml" \
      > "$dir/stdout" 2> "$dir/log" || { tail -30 "$dir/log"; exit 1; }
    read -r wall user sys kib < <(grep '^TIME' "$dir/log" | awk '{print $2, $3, $4, $5}')
    cpu=$(python3 -c "print(f'{$user + $sys:.2f}')")
    case $kind in
      skew) verdict=$(python3 "$SHARED/w4/check4.py" "$INPUT" "$dir/out" || true) ;;
      fields | wide) verdict=$(python3 "$HERE/wstate.py" check-fields "$INPUT" "$dir/out" || true) ;;
    esac
    printf '%-5s %-16s %8s %8s %12s %9s  %s\n' "$r" "weir-$config" "$wall" "$cpu" \
      "$(python3 -c "print(f'{$N/$wall:,.0f}')")" "$((kib / 1024))" "$verdict"
    echo "weir-$config $wall $cpu" >> "$WORK/results"
  done
done

echo
echo "medians over $RUNS rounds:"
bench_medians "$WORK/results" "$N"
