# scripts/services/lib.sh: what the service scripts (kafka.sh, postgres.sh, s3.sh) share, sourced
# by each after it sets `service` (its name, used in messages). Not meant to be run.
#
#   say TEXT...                     a progress line `<service>.sh: TEXT` on stderr
#   die WHAT [HELP...]              `<service>.sh: error: WHAT` and indented help lines on
#                                   stderr, then exit 1
#   lock_cache DIR [FILE]           make DIR and hold an exclusive lock on DIR/FILE (default
#                                   `lock`) on fd 9 until the script ends; concurrent callers
#                                   (parallel test binaries) wait their turn. A server started
#                                   afterwards must close fd 9 (`9>&-`), or it holds the lock
#   pid_running PIDFILE             whether PIDFILE names a live process
#   start_detached PIDFILE LOG CMD...
#                                   start CMD in a session of its own (it outlives the test
#                                   binary that asked for it), stdout and stderr to LOG, fd 9
#                                   closed; its pid goes to PIDFILE
#   wait_answering TRIES STEP [PIDFILE]
#                                   call the script's `answers` function every STEP seconds,
#                                   at most TRIES times: 0 once it answers, 2 as soon as the
#                                   process of PIDFILE (when given) is gone, 1 when time is up
#   print_settings KEY=VALUE...     the settings, one a line, on stdout (the only stdout output
#                                   of `ensure`)
#
# Each script keeps its own paths, ports, installs and messages; see the scripts' headers.

say() { printf '%s.sh: %s\n' "$service" "$*" >&2; }

die() {
  say "error: $1"
  shift
  for line in "$@"; do printf '  %s\n' "$line" >&2; done
  exit 1
}

lock_cache() {
  mkdir -p "$1"
  exec 9>"$1/${2:-lock}"
  flock 9
}

pid_running() {
  [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

start_detached() {
  local pidfile=$1 log=$2
  shift 2
  setsid "$@" >"$log" 2>&1 </dev/null 9>&- &
  echo $! >"$pidfile"
}

wait_answering() {
  local tries=$1 step=$2 pidfile=${3:-} i
  for i in $(seq 1 "$tries"); do
    answers && return 0
    if [ -n "$pidfile" ] && ! pid_running "$pidfile"; then
      return 2
    fi
    sleep "$step"
  done
  return 1
}

print_settings() {
  printf '%s\n' "$@"
}
