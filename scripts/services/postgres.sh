#!/usr/bin/env bash
# postgres.sh: a PostgreSQL server of Weir's own for the connector tests and local runs.
#
#   scripts/services/postgres.sh ensure   install PostgreSQL if missing (Debian's package), make
#                                         a cluster of our own in the cache dir, start it if it
#                                         is not running, wait until it answers, then print
#                                         KEY=VALUE lines on stdout (nothing else goes there)
#   scripts/services/postgres.sh stop     stop that server (the cluster's files stay)
#
# The cluster lives in ${WEIR_SERVICES_DIR:-/var/tmp/weir-services}/postgres/ (data/, the log
# server.log, the socket directory run/), outside the clone, and listens on 127.0.0.1 only, port
# ${WEIR_POSTGRES_PORT:-15432}. It never touches the system's own clusters. Prepared transactions
# are enabled (max_prepared_transactions = 64): the `postgres` sink's exactly-once mode needs
# them (WEIR_POSTGRES_MAX_PREPARED overrides the number, for a test of the refusal at 0).
# Authentication is `trust` on loopback for the user `weir` (a superuser made here), so
# tests can create and drop databases of their own. PostgreSQL refuses to run as root, so when
# run as root everything runs as the `postgres` user (which the Debian package creates).
# Concurrent callers (parallel test binaries) are serialised by a flock on a lock file.
#
# Printed settings:
#   WEIR_TEST_POSTGRES_URL=postgres://weir@127.0.0.1:<port>/postgres   an admin connection
#   WEIR_TEST_POSTGRES_HOST, WEIR_TEST_POSTGRES_PORT, WEIR_TEST_POSTGRES_USER
#   WEIR_TEST_POSTGRES_BIN=<dir of psql, pg_ctl, ...>
set -euo pipefail

service=postgres
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cache=${WEIR_SERVICES_DIR:-/var/tmp/weir-services}/postgres
port=${WEIR_POSTGRES_PORT:-15432}
user=weir
data=$cache/data
run=$cache/run
log=$cache/server.log

# The newest installed server binaries.
find_bin() {
  local d
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$d/postgres" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
      printf '%s\n' "$d"
      return 0
    fi
  done
  return 1
}

install_postgres() {
  command -v apt-get >/dev/null 2>&1 ||
    die "PostgreSQL is not installed and there is no apt-get to install it." \
      "Install the PostgreSQL server (initdb, pg_ctl, postgres), then run me again."
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "installing PostgreSQL needs root. As root, run:" \
      "apt-get update && apt-get install -y --no-install-recommends postgresql"
    sudo=(sudo)
  fi
  say "installing postgresql with apt-get"
  "${sudo[@]}" apt-get update -q >&2 || die "apt-get update failed (see above)."
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    postgresql >&2 || die "apt-get install postgresql failed (see above)."
}

# Runs a command as the cluster's owner: `postgres` when we are root, else ourselves.
as_owner() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

answers() {
  "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" -U "$user" -d postgres >/dev/null 2>&1
}

settings() {
  print_settings "WEIR_TEST_POSTGRES_URL=postgres://$user@127.0.0.1:$port/postgres" \
    "WEIR_TEST_POSTGRES_HOST=127.0.0.1" \
    "WEIR_TEST_POSTGRES_PORT=$port" \
    "WEIR_TEST_POSTGRES_USER=$user" \
    "WEIR_TEST_POSTGRES_BIN=$bin"
}

ensure() {
  if ! bin=$(find_bin); then
    install_postgres
    bin=$(find_bin) || die "PostgreSQL's server binaries are still missing after installing it."
  fi
  if [ "$(id -u)" -eq 0 ]; then
    id postgres >/dev/null 2>&1 ||
      die "there is no \`postgres\` user to run the server as (PostgreSQL refuses root)." \
        "Reinstall Debian's postgresql package, which creates it."
    chown postgres: "$cache"
  fi
  as_owner mkdir -p "$run"
  if [ ! -f "$data/PG_VERSION" ]; then
    say "creating a cluster in $data"
    rm -rf "$data"
    as_owner "$bin/initdb" -D "$data" -U "$user" --auth=trust -E UTF8 --locale=C.UTF-8 \
      >"$cache/initdb.log" 2>&1 || {
      cat "$cache/initdb.log" >&2
      die "initdb failed (above)."
    }
  fi
  if answers; then
    settings
    return 0
  fi
  # A server killed hard leaves its pid file behind; pg_ctl sees a dead pid and starts anyway.
  say "starting PostgreSQL on 127.0.0.1:$port (log: $log)"
  # fd 9 (the lock) must not be inherited by the server, or it would hold the lock forever.
  as_owner "$bin/pg_ctl" -D "$data" -l "$log" -w -t 60 start 9>&- -o "-c listen_addresses=127.0.0.1 \
-c port=$port -c unix_socket_directories=$run -c max_prepared_transactions=${WEIR_POSTGRES_MAX_PREPARED:-64} \
-c max_connections=200 -c fsync=on -c shared_buffers=64MB" >&2 || {
    tail -n 30 "$log" >&2 || true
    die "PostgreSQL did not start (its log is above, in $log)." \
      "Is port $port taken? Set WEIR_POSTGRES_PORT to another one."
  }
  if wait_answering 120 0.5; then
    settings
    return 0
  fi
  tail -n 30 "$log" >&2 || true
  die "PostgreSQL started but does not answer on 127.0.0.1:$port (log above, in $log)."
}

stop() {
  bin=$(find_bin) || exit 0
  [ -f "$data/postmaster.pid" ] || exit 0
  as_owner "$bin/pg_ctl" -D "$data" -m fast -w stop >&2 || true
}

cmd=${1:-}
case "$cmd" in
  ensure | stop) ;;
  *) die "usage: $0 ensure|stop" ;;
esac
lock_cache "$cache" .lock
"$cmd"
