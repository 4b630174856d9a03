#!/usr/bin/env bash
# The Kafka benchmark of issue 16: W1 (built-in aggregate) reading its input from a 2-partition
# topic through Weir, against a bare rdkafka consumer reading the same topic to its end (the
# limit; the target is Weir >= 70 % of it).
#
#   bench/kafka/run.sh [N]      (default N=2000000)
#
# Input: /tmp/weirbench/n$N.jsonl and its n$N.expected.json (the shared W1 input, made by
# /work/shared/bench/gen.py), else generated into $WORK with bench_gen. The broker is
# scripts/services/kafka.sh's tansu. The input is loaded once into a topic named in
# $WORK/topic-n$N (by `kafka_bare produce`, which seals every partition so that tansu's
# "latest offset" is the true end); later runs reuse it while the broker keeps it (LOAD=1
# loads a fresh topic). Then RUNS rounds alternate the two readers; each checks its count:
# the bare reader must read exactly N messages, Weir's W1 output must match the expected
# per-user totals (every record counted once). Prints records/s per round, the medians and
# the ratio.
#
# Env: WORK (/tmp/weirbench-kafka), RUNS (3), LOAD (set: load a new topic), SKIP_BUILD (set:
# use the binaries already in $CARGO_TARGET_DIR/release), CHECK (check.py).
set -euo pipefail
N=${1:-2000000}
WORK=${WORK:-/tmp/weirbench-kafka}
RUNS=${RUNS:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CHECK=${CHECK:-/work/shared/bench/check.py}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
mkdir -p "$WORK"

eval "$("$ROOT/scripts/services/kafka.sh" ensure)"
BROKERS=$WEIR_TEST_KAFKA_BROKERS
if [ -z "${SKIP_BUILD:-}" ]; then
  (cd "$ROOT" && ./cargo.sh build --release -q --bin weir &&
    ./cargo.sh build --release -q -p weir-engine --example bench_gen --example kafka_bare)
fi
WEIR=$TARGET/release/weir
GEN=$TARGET/release/examples/bench_gen
BARE=$TARGET/release/examples/kafka_bare

INPUT=/tmp/weirbench/n$N.jsonl
EXPECTED=/tmp/weirbench/n$N.expected.json
if [ ! -s "$INPUT" ] || [ ! -s "$EXPECTED" ]; then
  INPUT=$WORK/n$N.jsonl
  EXPECTED=$WORK/n$N.expected.json
  if [ ! -s "$INPUT" ] || [ ! -s "$EXPECTED" ]; then
    echo "generating $N records into $INPUT"
    "$GEN" "$N" "$INPUT"
  fi
fi

TOPIC_FILE=$WORK/topic-n$N
if [ -n "${LOAD:-}" ] || [ ! -s "$TOPIC_FILE" ]; then
  TOPIC=w1-n$N-$(date +%s)
  "$WEIR_TEST_KAFKA_TANSU" topic create "$TOPIC" --partitions 2 --broker "tcp://$BROKERS" >/dev/null
  "$BARE" produce "$BROKERS" "$TOPIC" 2 "$INPUT"
  echo "$TOPIC" > "$TOPIC_FILE"
fi
TOPIC=$(cat "$TOPIC_FILE")
echo "topic $TOPIC ($N records from $INPUT)"

printf '%-5s %-8s %10s %14s %s\n' round reader wall_s records/s check
RESULTS=$WORK/results.tsv
: > "$RESULTS"
for r in $(seq "$RUNS"); do
  line=$("$BARE" read "$BROKERS" "$TOPIC")
  read -r messages wall rate < <(echo "$line" |
    sed -n 's/.*: \([0-9]*\) messages, [0-9]* bytes in \([0-9.]*\) s: \([0-9]*\) messages\/s/\1 \2 \3/p')
  if [ "$messages" != "$N" ]; then
    echo "the bare reader read $messages messages of $TOPIC, not $N (a broker restarted since the" >&2
    echo "load loses its topics: run again with LOAD=1)" >&2
    exit 1
  fi
  printf '%-5s %-8s %10s %14s %s\n' "$r" bare "$wall" "$rate" "ok:$messages"
  printf '%s\tbare\t%s\n' "$r" "$rate" >> "$RESULTS"

  dir=$WORK/w1-$r
  rm -rf "$dir" && mkdir -p "$dir"
  sed -e "s#BROKERS#$BROKERS#" -e "s#TOPIC#$TOPIC#" "$HERE/w1_kafka.yaml" > "$dir/pipeline.yaml"
  start=$(date +%s.%N)
  "$WEIR" run --no-progress --no-api "$dir/pipeline.yaml" > "$dir/stdout" 2> "$dir/log" || { cat "$dir/log"; exit 1; }
  wall=$(python3 -c "print(f'{$(date +%s.%N) - $start:.3f}')")
  verdict=$(python3 "$CHECK" w1 "$dir/out" "$EXPECTED") || true
  case "$verdict" in
    OK*) ;;
    *) echo "weir's W1 output is wrong (did the source stop before the end?): $verdict" >&2; exit 1 ;;
  esac
  rate=$(python3 -c "print(round($N/$wall))")
  printf '%-5s %-8s %10s %14s %s\n' "$r" weir "$wall" "$rate" "$(echo "$verdict" | cut -d' ' -f1)"
  printf '%s\tweir\t%s\n' "$r" "$rate" >> "$RESULTS"
done

python3 - "$RESULTS" <<'PY'
import statistics, sys
rates = {"bare": [], "weir": []}
for line in open(sys.argv[1]):
    _, reader, rate = line.split()
    rates[reader].append(float(rate))
bare, weir = statistics.median(rates["bare"]), statistics.median(rates["weir"])
print(f"median: bare {bare:,.0f} messages/s, weir W1 {weir:,.0f} records/s: {weir / bare:.0%} of the bare rate (target >= 70 %)")
PY
