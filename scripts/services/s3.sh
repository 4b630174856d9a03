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

DIR="${WEIR_SERVICES_DIR:-/var/tmp/weir-services}/s3"
PORT="${WEIR_S3_PORT:-15055}"
VENV="$DIR/venv"
PIDFILE="$DIR/moto.pid"
LOG="$DIR/moto.log"
ENDPOINT="http://127.0.0.1:$PORT"

log() { echo "s3.sh: $*" >&2; }

answers() {
    curl -s -o /dev/null --max-time 2 "$ENDPOINT/moto-api/" 2>/dev/null
}

running() {
    [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null
}

install() {
    if [[ -x "$VENV/bin/moto_server" ]]; then
        return
    fi
    log "installing moto[server] into $VENV (from PyPI)"
    if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
        log "python3-venv is missing; installing it with apt-get"
        DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv >&2 \
            || { log "cannot install python3-venv (run: apt-get install python3-venv)"; exit 1; }
    fi
    rm -rf "$VENV"
    python3 -m venv "$VENV" >&2
    "$VENV/bin/pip" install --quiet --disable-pip-version-check 'moto[server]>=5,<6' >&2 \
        || { log "pip install 'moto[server]' failed (is PyPI reachable?)"; rm -rf "$VENV"; exit 1; }
}

start() {
    if running && answers; then
        return
    fi
    if answers; then
        log "port $PORT already answers but was not started by this script; using it"
        return
    fi
    log "starting moto on $ENDPOINT (log: $LOG)"
    # setsid: the server outlives the test binary that started it, and is not in its
    # process group; fd 9 (the lock) is closed so that it does not hold the lock.
    setsid "$VENV/bin/moto_server" -H 127.0.0.1 -p "$PORT" >"$LOG" 2>&1 </dev/null 9>&- &
    echo $! >"$PIDFILE"
    for _ in $(seq 1 150); do
        if answers; then
            return
        fi
        if ! running; then
            log "moto exited while starting; its log ($LOG):"
            tail -n 20 "$LOG" >&2 || true
            exit 1
        fi
        sleep 0.2
    done
    log "moto did not answer on $ENDPOINT within 30 s; its log ($LOG):"
    tail -n 20 "$LOG" >&2 || true
    exit 1
}

settings() {
    echo "AWS_ENDPOINT_URL=$ENDPOINT"
    echo "AWS_ALLOW_HTTP=true"
    echo "AWS_ACCESS_KEY_ID=weir-test"
    echo "AWS_SECRET_ACCESS_KEY=weir-test"
    echo "AWS_REGION=us-east-1"
    echo "WEIR_TEST_S3_ENDPOINT=$ENDPOINT"
}

case "${1:-}" in
    ensure)
        mkdir -p "$DIR"
        exec 9>"$DIR/lock"
        flock 9
        install
        start
        settings
        ;;
    stop)
        mkdir -p "$DIR"
        exec 9>"$DIR/lock"
        flock 9
        if running; then
            log "stopping moto (pid $(cat "$PIDFILE"))"
            kill "$(cat "$PIDFILE")"
        fi
        rm -f "$PIDFILE"
        ;;
    *)
        echo "usage: $0 ensure|stop" >&2
        exit 2
        ;;
esac
