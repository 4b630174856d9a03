#!/usr/bin/env bash
# The `postgres` sink's throughput against a plain COPY of the same rows (issue 16).
#
#   bench/postgres/sink.sh [N]      (default N=1000000)
#
# N records {id, name, amount} go from a JSON-lines file through `weir run` (file source,
# parallelism 2, a `postgres` sink of parallelism 2) into an unlogged-free, index-free table, in
# each of these set-ups (labels):
#   eo-insert     exactly_once checkpoints every 1 s (prepared transactions), insert
#   alo-insert    at_least_once checkpoints every 1 s, insert (each batch commits)
#   eo-upsert     exactly_once, upsert on a primary key `id`
# and, as the limit, `copy`: psql's `\copy` of the same rows as CSV into the same table (one
# connection, one transaction). Each run starts from an empty table in a database of its own
# and is checked (row count, sum of `amount`). Prints rows/s per label and run, then the
# median per label and its ratio to COPY's.
#
# Env: WORK (/tmp/weirbench/postgres), RUNS (2), ONLY (labels to run; default all),
# BATCH (the sink's batch_size, default 1000), SKIP_BUILD (set: use the binary already in
# $CARGO_TARGET_DIR/release). The server is scripts/services/postgres.sh's.
set -euo pipefail
N=${1:-1000000}
WORK=${WORK:-/tmp/weirbench/postgres}
RUNS=${RUNS:-2}
ONLY=${ONLY:-eo-insert alo-insert eo-upsert copy}
BATCH=${BATCH:-1000}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
mkdir -p "$WORK"

if [ -z "${SKIP_BUILD:-}" ]; then
  (cd "$ROOT" && ./cargo.sh build --release -q)
fi
WEIR=$TARGET/release/weir

eval "$("$ROOT/scripts/services/postgres.sh" ensure)"
PSQL=$WEIR_TEST_POSTGRES_BIN/psql
export PGOPTIONS="-c client_min_messages=warning"
BASE=postgres://$WEIR_TEST_POSTGRES_USER@$WEIR_TEST_POSTGRES_HOST:$WEIR_TEST_POSTGRES_PORT
psql_in() { "$PSQL" -X -q -t -A -v ON_ERROR_STOP=1 -d "$BASE/$1" -c "$2"; }

JSONL=$WORK/n$N.jsonl
CSV=$WORK/n$N.csv
if [ ! -s "$JSONL" ] || [ ! -s "$CSV" ]; then
  echo "writing $N records to $JSONL and $CSV" >&2
  python3 - "$N" "$JSONL" "$CSV" <<'PY'
import sys
n, jl, cs = int(sys.argv[1]), sys.argv[2], sys.argv[3]
with open(jl, "w") as j, open(cs, "w") as c:
    for i in range(n):
        a = (i * 7919) % 1000
        j.write('{"id":%d,"name":"n%d","amount":%d}\n' % (i, i, a))
        c.write("%d,n%d,%d\n" % (i, i, a))
PY
fi
EXPECT_SUM=$(python3 -c "print(sum((i * 7919) % 1000 for i in range($N)))")

fresh_db() { # db, ddl
  psql_in postgres "DROP DATABASE IF EXISTS $1" >/dev/null
  psql_in postgres "CREATE DATABASE $1" >/dev/null
  psql_in "$1" "$2" >/dev/null
}

check() { # db, label
  local got
  got=$(psql_in "$1" "SELECT count(*) || ' ' || coalesce(sum(amount), 0) FROM events")
  if [ "$got" != "$N $EXPECT_SUM" ]; then
    echo "$2: wrong table: count and sum $got, expected $N $EXPECT_SUM" >&2
    exit 1
  fi
}

pipeline() { # file, mode, sink extras
  cat >"$1" <<YAML
version: 1
api: {enabled: false}
pipelines:
  - id: pgbench
    parallelism: 2
    state: {backend: fs}
    checkpoints: {interval: 1s, mode: $2, storage: $WORK/ck}
    sources:
      - {id: in, type: file, path: $JSONL}
    sinks:
      - id: db
        type: postgres
        input: in
        connection_env: WEIR_BENCH_PG
        table: events
        batch_size: $BATCH
        columns: {id: id, name: name, amount: amount}
$3
YAML
}

now() { date +%s.%N; }
rate() { python3 -c "print(f'{$N / ($2 - $1):,.0f}')"; }

RESULTS=$WORK/results.tsv
: >"$RESULTS"
for run in $(seq 1 "$RUNS"); do
  for label in $ONLY; do
    db=weir_bench_${label//-/_}
    ddl="CREATE TABLE events (id bigint NOT NULL, name text, amount bigint)"
    extra=""
    mode=exactly_once
    case "$label" in
      eo-insert) ;;
      alo-insert) mode=at_least_once ;;
      eo-upsert)
        ddl="CREATE TABLE events (id bigint PRIMARY KEY, name text, amount bigint)"
        extra="        mode: upsert
        key: [id]"
        ;;
      copy) ;;
      *) echo "unknown label $label" >&2; exit 1 ;;
    esac
    fresh_db "$db" "$ddl"
    rm -rf "$WORK/ck"
    if [ "$label" = copy ]; then
      t0=$(now)
      "$PSQL" -X -q -v ON_ERROR_STOP=1 -d "$BASE/$db" -c "\\copy events FROM '$CSV' (FORMAT csv)"
      t1=$(now)
    else
      pipeline "$WORK/job.yaml" "$mode" "$extra"
      t0=$(now)
      WEIR_BENCH_PG=$BASE/$db "$WEIR" run --no-progress --no-api --fresh "$WORK/job.yaml" \
        >"$WORK/$label-$run.out" 2>"$WORK/$label-$run.err"
      t1=$(now)
    fi
    check "$db" "$label"
    printf '%-11s run %d: %s rows/s (%.2f s)\n' "$label" "$run" "$(rate "$t0" "$t1")" \
      "$(python3 -c "print($t1 - $t0)")"
    printf '%s\t%s\n' "$label" "$(python3 -c "print($N / ($t1 - $t0))")" >>"$RESULTS"
  done
done

# Medians per label, and each against COPY (the limit).
python3 - "$RESULTS" <<'PY'
import statistics, sys
rates = {}
for line in open(sys.argv[1]):
    label, rate = line.split()
    rates.setdefault(label, []).append(float(rate))
copy = statistics.median(rates["copy"]) if "copy" in rates else None
for label, rs in rates.items():
    m = statistics.median(rs)
    vs = f": {m / copy:.0%} of COPY" if copy and label != "copy" else ""
    print(f"median {label:<11} {m:>12,.0f} rows/s{vs}")
PY
