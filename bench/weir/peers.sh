#!/usr/bin/env bash
# Weir against Flink in one sitting, alternating: Flink W1 (HashMap) twice and Flink W2 (HashMap
# + Python UDF map) once, interleaved with Weir W1 built-in and W2 at parallelism 2. Prints wall,
# CPU and peak RSS per run and check.py's verdict.
#
# Needs: the peers set up as in shared/bench/README.md (PEER_VENVS, flink/run.sh build,
# $P/n10m.jsonl and its expected totals), and a previous `bench/weir/run.sh 10000000`, whose
# pipeline files under $WORK this reuses.
#
#   bench/weir/peers.sh      (P=/tmp/peerbench; WORK=/tmp/weirbench; BENCH=../shared/bench)
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
export PEER_VENVS=${PEER_VENVS:-$HOME/.cache/weir-peers}
P=${P:-/tmp/peerbench}
WORK=${WORK:-/tmp/weirbench}
B=${BENCH:-$ROOT/../shared/bench}
[ -d "$B" ] || B=/work/shared/bench
W=${CARGO_TARGET_DIR:-$ROOT/target}/release/weir
mkdir -p $P/out
weir_run() {
  local wl=$1 kind=$2
  /usr/bin/time -f "weir-$wl-p2 %e s wall %U+%S cpu %M KiB" -o /tmp/t.weir $W run --no-progress $WORK/$wl-p2/pipeline.yaml >/dev/null 2>&1
  echo "$(date +%T) $(cat /tmp/t.weir) $(python3 $B/check.py $kind $WORK/$wl-p2/out $WORK/n10000000.expected.json | cut -c1-40)"
}
flink_run() {
  local wl=$1
  rm -rf $P/out/flink-$wl
  /usr/bin/time -f "flink-$wl %e s wall %U+%S cpu %M KiB" -o /tmp/t.flink bash $B/flink/run.sh $wl hashmap $P/n10m.jsonl $P/out/flink-$wl > /tmp/flink-$wl.log 2>&1
  echo "$(date +%T) $(cat /tmp/t.flink) $(grep -o 'job_net_runtime_ms[^ ]*' /tmp/flink-$wl.log | head -1) $(python3 $B/check.py $wl $P/out/flink-$wl $P/n10m.expected.json | cut -c1-40)"
}
uptime
flink_run w1; weir_run w1_builtin w1; weir_run w2_map w2
weir_run w1_builtin w1; flink_run w1; weir_run w2_map w2
flink_run w2; weir_run w2_map w2
uptime
