# Shared by the benchmark scripts (sourced): the machine is shared, so each run first waits
# for the 1-minute load to fall to LOADMAX (at most MAXWAIT seconds) and records it.
load1() { cut -d' ' -f1 /proc/loadavg; }
# Waits until the 1-minute load is at most LOADMAX (or MAXWAIT passed); prints the load seen.
wait_load() {
  local waited=0
  while python3 -c "import sys; sys.exit(0 if $(load1) > $LOADMAX else 1)" && [ "$waited" -lt "$MAXWAIT" ]; do
    sleep 5; waited=$((waited + 5))
  done
  local l; l=$(load1)
  if [ "$waited" -gt 0 ]; then
    echo "  (waited ${waited}s for load <= $LOADMAX; now $l)" >&2
  fi
  echo "$l"
}
