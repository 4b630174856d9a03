#!/usr/bin/env python3
"""Runs a command and prints the peak of the summed resident set size of it and all its
descendants (sampled from /proc every INTERVAL seconds), which is what a multi-process peer
uses in total; `/usr/bin/time %M` reports only the largest single process.

    peak_rss.py OUT_FILE COMMAND [ARGS...]

Writes `<peak KiB summed> <largest single process KiB (getrusage)> <wall s> <cpu s>` to
OUT_FILE; the command's stdout/stderr pass through; exits with its exit code.
Env: INTERVAL (0.05).
"""
import os
import resource
import subprocess
import sys
import time


def children(pid):
    out = []
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            out = [int(p) for p in f.read().split()]
    except OSError:
        pass
    return out


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss(root):
    total, todo, seen = 0, [root], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        total += rss_kib(p)
        todo.extend(children(p))
    return total


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    interval = float(os.environ.get("INTERVAL", "0.05"))
    t0 = time.time()
    proc = subprocess.Popen(sys.argv[2:])
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(interval)
    wall = time.time() - t0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(sys.argv[1], "w") as f:
        f.write(f"{peak} {ru.ru_maxrss} {wall:.2f} {ru.ru_utime + ru.ru_stime:.2f}\n")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
