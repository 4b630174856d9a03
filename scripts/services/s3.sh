#!/usr/bin/env bash
# An S3-compatible server for Weir's tests: moto (PyPI `moto[server]`) in a venv under
# ${WEIR_SERVICES_DIR:-/var/tmp/weir-services}/s3, listening on 127.0.0.1:${WEIR_S3_PORT:-15055}.
#
#   scripts/services/s3.sh ensure   install if missing, start if not running, wait until it
#                                   answers, print the AWS_* settings (KEY=VALUE) on stdout
#   scripts/services/s3.sh stop     stop the server started by `ensure`
#
# Only the settings go to stdout; progress goes to stderr. The script creates no buckets:
# every test creates its own bucket or prefix. It is idempotent and safe to run from several
# test binaries at once (a flock on a lock file in the cache dir).
set -euo pipefail

service=s3
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DIR="${WEIR_SERVICES_DIR:-/var/tmp/weir-services}/s3"
PORT="${WEIR_S3_PORT:-15055}"
VENV="$DIR/venv"
PIDFILE="$DIR/moto.pid"
LOG="$DIR/moto.log"
ENDPOINT="http://127.0.0.1:$PORT"

answers() {
    curl -s -o /dev/null --max-time 2 "$ENDPOINT/moto-api/" 2>/dev/null
}

running() {
    pid_running "$PIDFILE"
}

install() {
    if [[ -x "$VENV/bin/moto_server" ]]; then
        return
    fi
    say "installing moto[server] into $VENV (from PyPI)"
    if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
        say "python3-venv is missing; installing it with apt-get"
        DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv >&2 \
            || { say "cannot install python3-venv (run: apt-get install python3-venv)"; exit 1; }
    fi
    rm -rf "$VENV"
    python3 -m venv "$VENV" >&2
    "$VENV/bin/pip" install --quiet --disable-pip-version-check 'moto[server]>=5,<6' >&2 \
        || { say "pip install 'moto[server]' failed (is PyPI reachable?)"; rm -rf "$VENV"; exit 1; }
}

start() {
    if running && answers; then
        return
    fi
    if answers; then
        say "port $PORT already answers but was not started by this script; using it"
        return
    fi
    say "starting moto on $ENDPOINT (log: $LOG)"
    start_detached "$PIDFILE" "$LOG" "$VENV/bin/moto_server" -H 127.0.0.1 -p "$PORT"
    local rc=0
    wait_answering 150 0.2 "$PIDFILE" || rc=$?
    case $rc in
        0) return ;;
        2) say "moto exited while starting; its log ($LOG):" ;;
        *) say "moto did not answer on $ENDPOINT within 30 s; its log ($LOG):" ;;
    esac
    tail -n 20 "$LOG" >&2 || true
    exit 1
}

settings() {
    print_settings "AWS_ENDPOINT_URL=$ENDPOINT" "AWS_ALLOW_HTTP=true" \
        "AWS_ACCESS_KEY_ID=weir-test" "AWS_SECRET_ACCESS_KEY=weir-test" \
        "AWS_REGION=us-east-1" "WEIR_TEST_S3_ENDPOINT=$ENDPOINT"
}

case "${1:-}" in
    ensure)
        lock_cache "$DIR"
        install
        start
        settings
        ;;
    stop)
        lock_cache "$DIR"
        if running; then
            say "stopping moto (pid $(cat "$PIDFILE"))"
            kill "$(cat "$PIDFILE")"
        fi
        rm -f "$PIDFILE"
        ;;
    *)
        echo "usage: $0 ensure|stop" >&2
        exit 2
        ;;
esac
