#!/usr/bin/env python3
"""Checks an output of bench/weir/mem.sh against its input: one line per user,
{"key": user, "deciles": {"<d>": count, ...}} with d = (amount - 1) // 10.

    check_mem.py INPUT.jsonl OUTPUT [OUTPUT...]      (outputs: files or directories)

Prints `OK (<users> keys)` or `FAIL: <reason>`; exits 1 on failure.
"""
import json
import os
import sys
from collections import defaultdict


def lines(path):
    if os.path.isdir(path):
        for root, _, files in os.walk(path):
            for f in sorted(files):
                if not f.startswith("."):
                    yield from lines(os.path.join(root, f))
        return
    with open(path) as f:
        yield from f


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    want = defaultdict(lambda: defaultdict(int))
    for line in lines(sys.argv[1]):
        r = json.loads(line)
        want[r["user"]][str((r["amount"] - 1) // 10)] += 1
    got = {}
    for out in sys.argv[2:]:
        for line in lines(out):
            if not line.strip():
                continue
            r = json.loads(line)
            if r["key"] in got:
                print(f"FAIL: key {r['key']} emitted twice")
                sys.exit(1)
            got[r["key"]] = r["deciles"]
    if len(got) != len(want):
        print(f"FAIL: {len(got)} keys, expected {len(want)}")
        sys.exit(1)
    for k, d in want.items():
        if got.get(k) != d:
            print(f"FAIL: key {k}: {got.get(k)} != {dict(d)}")
            sys.exit(1)
    print(f"OK ({len(got)} keys)")


if __name__ == "__main__":
    main()
