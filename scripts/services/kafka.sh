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
#
# Safe to run from several processes at once: every command holds a lock file in the cache.
set -euo pipefail

say() { printf 'kafka.sh: %s\n' "$*" >&2; }
die() {
  say "error: $1"
  shift
  for line in "$@"; do printf '  %s\n' "$line" >&2; done
  exit 1
}

dir=${WEIR_SERVICES_DIR:-/var/tmp/weir-services}/kafka
port=${WEIR_KAFKA_PORT:-19092}
version=${WEIR_TANSU_VERSION:-0.6.0}
bin=$dir/bin/tansu
pidfile=$dir/broker.pid
log=$dir/broker.log

command=${1:-}
case "$command" in
  ensure | install | stop) ;;
  *) die "usage: $0 ensure|install|stop" ;;
esac

mkdir -p "$dir"
exec 9>"$dir/lock"
flock 9

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
  [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

answers() {
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
}

start() {
  if running; then
    answers && return 0
  elif answers; then
    die "something else listens on 127.0.0.1:$port, not a broker this script started." \
      "Stop it, or choose another port with WEIR_KAFKA_PORT."
  else
    say "starting the broker on 127.0.0.1:$port (log: $log)"
    # setsid: the broker outlives the test binary that asked for it (other tests reuse it).
    # 9>&-: it must not inherit the lock, or every later call would wait for it forever.
    setsid "$bin" broker \
      --listener-url "tcp://127.0.0.1:$port" \
      --advertised-listener-url "tcp://127.0.0.1:$port" \
      --storage-engine memory://tansu/ \
      >"$log" 2>&1 </dev/null 9>&- &
    echo $! >"$pidfile"
  fi
  local i
  for i in $(seq 1 300); do
    answers && return 0
    running || {
      tail -n 30 "$log" >&2
      die "the broker exited while starting (log: $log)."
    }
    sleep 0.1
  done
  tail -n 30 "$log" >&2
  die "the broker did not answer on 127.0.0.1:$port within 30 s (log: $log)."
}

case "$command" in
  install) install ;;
  ensure)
    install
    start
    echo "WEIR_TEST_KAFKA_BROKERS=127.0.0.1:$port"
    echo "WEIR_TEST_KAFKA_TANSU=$bin"
    ;;
  stop)
    if running; then
      kill "$(cat "$pidfile")"
      say "stopped the broker"
    fi
    rm -f "$pidfile"
    ;;
esac
