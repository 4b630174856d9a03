#!/usr/bin/env bash
# Issue 17 overhead, N records, parallelism 2, interleaved per round:
#  W1 built-in and W1 with exactly-once 1 s checkpoints (w1_ckpt): before (main before issue 17),
#  after (metrics on, the default), off (after, --no-metrics), tap (after, metrics on, with
#  `weir tap w1 totals --input` (every record offered) open during the run);
#  W2 Rhai map and W1 Rhai reduce: before and after (the strict data errors change the script engine).
set -euo pipefail
N=${N:-10000000}; ROUNDS=${ROUNDS:-3}
W=${W:-/tmp/weirbench}  # $W/n$N.jsonl and n$N.expected.json, as bench/weir/run.sh makes them
HERE=$(cd "$(dirname "$0")" && pwd)
BEFORE=${BEFORE:?the weir binary to compare against}
AFTER=${AFTER:?the weir binary under test}
CHECK=${CHECK:-$HERE/../../../shared/bench/check.py}
one() { # wl variant
  local wl=$1 v=$2 d=$W/ab17-$1-$2 bin=$AFTER extra="" kind=w1 tp=""
  case $wl in w2*) kind=w2;; esac
  rm -rf $d; mkdir -p $d
  sed -e "s#path: input.jsonl#path: $W/n$N.jsonl#" $HERE/$wl.yaml > $d/pipeline.yaml
  case $v in before) bin=$BEFORE;; off) extra=--no-metrics;; esac
  local port=$((9100 + RANDOM % 500))
  if [ $v = tap ]; then
    ( for i in $(seq 200); do $AFTER tap w1 totals --input --api 127.0.0.1:$port > $d/tap.out 2> $d/tap.err && break; grep -q "records" $d/tap.err 2>/dev/null && break; sleep 0.02; done ) &
    tp=$!
  fi
  ( cd $d && /usr/bin/time -f "TIME %e %U %S %M" $bin run --no-progress --api-port $port $extra $d/pipeline.yaml > $d/stdout 2> $d/log ) || { tail $d/log; exit 1; }
  [ -n "$tp" ] && { wait $tp || true; }
  # Wall time, and CPU time (user + system), which a busy machine disturbs less.
  local t=$(grep '^TIME' $d/log | awk '{print $2}') cpu=$(grep '^TIME' $d/log | awk '{printf "%.2f", $3 + $4}')
  local ok=$(python3 $CHECK $kind $d/out $W/n$N.expected.json | cut -d' ' -f1)
  local info=""; [ $v = tap ] && info="tapped=$(wc -l < $d/tap.out)"
  echo "$r $wl $v $t cpu=$cpu $ok $info"
}
for r in $(seq $ROUNDS); do
  for wl in w1_builtin w1_ckpt; do for v in before after off tap; do one $wl $v; done; done
  for wl in w2_map w1_reduce; do for v in before after; do one $wl $v; done; done
done
