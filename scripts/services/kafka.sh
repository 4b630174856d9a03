#!/usr/bin/env bash
# scripts/services/kafka.sh: a Kafka-API broker for Weir's connector tests and local runs.
#
#   scripts/services/kafka.sh ensure    install the broker if missing, start it if it is not
#                                       running, wait until it answers, then print its settings
#                                       as KEY=VALUE lines on stdout (nothing else goes there):
#                                         WEIR_TEST_KAFKA_BROKERS=127.0.0.1:19092
#                                         WEIR_TEST_KAFKA_TANSU=<the broker's binary>
#                                       (`tansu topic create NAME --partitions N --broker
#                                       tcp://127.0.0.1:19092` creates a topic)
#   scripts/services/kafka.sh install   only install (warms the cache; prints nothing on stdout)
#   scripts/services/kafka.sh stop      stop the broker this script started
#
# The broker is tansu (a Kafka-API broker written in Rust, from crates.io), installed with
# `cargo install tansu --locked --features dynostore` into a cache outside the clone, and run
# with its in-memory storage engine: a stopped broker forgets every topic, which is what tests
# want. The first install compiles about 500 crates (7-9 minutes on 2 cores, 1.5 GB of build
# files kept in the cache so that a reinstall is incremental). tansu implements the idempotent
# producer and consumer groups but not transactions.
#
# Environment:
#   WEIR_SERVICES_DIR   the cache (default /var/tmp/weir-services); this script uses <it>/kafka/
#   WEIR_KAFKA_PORT     the loopback port the broker listens on (default 19092)
#   WEIR_TANSU_VERSION  the crate version to install (default 0.6.0)
#   WEIR_KAFKA_INSTANCE a name for a broker of its own (a test's, which it stops and starts
#                       again): its pid file and log go to <cache>/kafka/instances/<name>/ and
#                       the shared broker is left alone; give it its own WEIR_KAFKA_PORT too.
#                       The binary is the shared one. Default: the shared broker.
#   WEIR_KAFKA_STORAGE  `memory` (default: tansu's in-memory engine; a restart empties it) or
#                       `s3`: topics and messages kept in the bucket `weir-kafka-<instance>` of
#                       the S3 service (scripts/services/s3.sh, started here when needed; tansu's
#                       `s3://` engine), so they survive `stop` and the next `ensure`, as long as
#                       the S3 service runs (moto keeps its objects in memory).
#
# Safe to run from several processes at once: every command holds a lock file in the cache
# (a named instance's start and stop hold a lock of its own after the install).
set -euo pipefail

service=kafka
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

dir=${WEIR_SERVICES_DIR:-/var/tmp/weir-services}/kafka
port=${WEIR_KAFKA_PORT:-19092}
version=${WEIR_TANSU_VERSION:-0.6.0}
bin=$dir/bin/tansu
instance=${WEIR_KAFKA_INSTANCE:-}
storage=${WEIR_KAFKA_STORAGE:-memory}
run=$dir${instance:+/instances/$instance}
pidfile=$run/broker.pid
log=$run/broker.log

command=${1:-}
case "$command" in
  ensure | install | stop) ;;
  *) die "usage: $0 ensure|install|stop" ;;
esac

case "$storage" in
  memory | s3) ;;
  *) die "WEIR_KAFKA_STORAGE is \`$storage\`; use memory or s3." ;;
esac
case "$instance" in
  *[!a-z0-9-]*) die "WEIR_KAFKA_INSTANCE is \`$instance\`; use lowercase letters, digits and -." ;;
esac

lock_cache "$dir"

install() {
  [ -x "$bin" ] && return 0
  command -v cargo >/dev/null 2>&1 ||
    die "cargo is not on PATH, and the broker (tansu) is installed with cargo." \
      "Install Rust with rustup (https://rustup.rs), or put a tansu binary at $bin."
  say "installing tansu $version into $dir (once; takes 7-9 minutes, log: $dir/install.log)"
  if ! CARGO_TARGET_DIR=$dir/target nice -n 10 cargo install tansu --version "$version" \
    --locked --features dynostore --root "$dir" >"$dir/install.log" 2>&1; then
    tail -n 30 "$dir/install.log" >&2
    die "cargo install tansu failed (full log: $dir/install.log)." \
      "Check the network and the crate registry, then run me again."
  fi
  [ -x "$bin" ] || die "cargo install tansu finished but $bin is missing."
  say "installed $bin"
}

running() {
  pid_running "$pidfile"
}

answers() {
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
}

# Sets `engine`, the broker's `--storage-engine`; with s3, exports the S3 service's AWS_*
# settings for the broker and makes its bucket.
storage_engine() {
  if [ "$storage" = memory ]; then
    engine=memory://tansu/
    return 0
  fi
  local settings bucket=weir-kafka-${instance:-shared} code
  settings=$(bash "$(dirname "${BASH_SOURCE[0]}")/s3.sh" ensure) ||
    die "the S3 service (scripts/services/s3.sh) did not start; the broker's s3 storage needs it."
  set -a
  eval "$settings"
  set +a
  code=$(curl -s -o /dev/null -w '%{http_code}' -X PUT "$AWS_ENDPOINT_URL/$bucket") || code=000
  case "$code" in
    2?? | 409) ;;
    *) die "cannot make the bucket $bucket on $AWS_ENDPOINT_URL (HTTP $code)." ;;
  esac
  engine=s3://$bucket/
}

start() {
  if running; then
    answers && return 0
  elif answers; then
    die "something else listens on 127.0.0.1:$port, not a broker this script started." \
      "Stop it, or choose another port with WEIR_KAFKA_PORT."
  else
    local engine
    storage_engine
    mkdir -p "$run"
    say "starting the broker on 127.0.0.1:$port with storage $engine (log: $log)"
    start_detached "$pidfile" "$log" "$bin" broker \
      --listener-url "tcp://127.0.0.1:$port" \
      --advertised-listener-url "tcp://127.0.0.1:$port" \
      --storage-engine "$engine"
  fi
  local rc=0
  wait_answering 300 0.1 "$pidfile" || rc=$?
  case $rc in
    0) return 0 ;;
    2)
      tail -n 30 "$log" >&2
      die "the broker exited while starting (log: $log)."
      ;;
  esac
  tail -n 30 "$log" >&2
  die "the broker did not answer on 127.0.0.1:$port within 30 s (log: $log)."
}

if [ -n "$instance" ] && [ "$command" != install ]; then
  [ "$command" = stop ] || install
  # From here on the instance's own lock (taking it releases the install's).
  lock_cache "$run"
fi

case "$command" in
  install) install ;;
  ensure)
    install
    start
    print_settings "WEIR_TEST_KAFKA_BROKERS=127.0.0.1:$port" "WEIR_TEST_KAFKA_TANSU=$bin"
    ;;
  stop)
    if running; then
      kill "$(cat "$pidfile")"
      say "stopped the broker"
    fi
    rm -f "$pidfile"
    ;;
esac
