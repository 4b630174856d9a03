#!/usr/bin/env python3
"""Inputs of the event-time reference pipelines: out-of-order and late events, seeded.

    python3 pipelines/event_data.py                   # rewrite the committed data/ files
    python3 pipelines/event_data.py KIND N OUT [SEED] # a larger input (KIND: clicks | events)

Every record carries its event time `ts` in epoch milliseconds. The records are written in
arrival order, which is not event-time order:

- most records move time forward a little (`ts` = the largest `ts` so far + a small step);
- about one in ten is **out of order within the bound**: up to 4 s behind the largest `ts` so
  far, less than every pipeline's `max_out_of_orderness` (5 s), so never late, whatever the
  watermark;
- a few are **late**: minutes behind. A late record is kept only when it is classified the
  same way (late within `allowed_lateness`, or late beyond it, per window) against the
  watermark right before it and against the watermark of `LAG` records earlier. A source may
  emit its watermark once per batch (at most 1024 records) instead of after every record, and
  a restore from a checkpoint cuts batches at another place; with `LAG` above the batch size
  such records are late, or not, the same way at every batching, parallelism and restore;
- `events` (sessions) also has **bridges**: a user's event that arrives right after a later
  event of the same user, between two bursts more than a gap apart, so that it merges the
  two sessions; the first session cannot have closed yet when it arrives.

`reference.py` re-checks the determinism claim independently: it computes every output with
the watermark lagging 1 record and `LAG` records behind the arrivals and requires equality.

Draws: splitmix64 (as ../../shared/bench/gen.py), so the bytes depend only on the arguments.
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MASK = (1 << 64) - 1
#: 2025-12-01T00:00:00Z, a multiple of every window size used.
T0 = 1_764_547_200_000
#: Records a watermark may lag behind the arrivals (above the runtime's batch size of 1024).
LAG = 1100
#: Bounded out-of-orderness of every event-time pipeline here (`max_out_of_orderness: 5s`).
OOO = 5_000

PAGES = ["home", "docs", "pricing", "blog", "signup", "about", "careers", "status"]
#: Relative popularity of the pages, so that windows have a clear top page, mostly.
WEIGHTS = [30, 22, 14, 11, 9, 6, 5, 3]


class Rng:
    """splitmix64."""

    def __init__(self, seed):
        self.s = seed & MASK

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & MASK
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n

    def between(self, lo, hi):
        """Uniform in [lo, hi]."""
        return lo + self.below(hi - lo + 1)

    def weighted(self, items, weights):
        x = self.below(sum(weights))
        for item, w in zip(items, weights):
            if x < w:
                return item
            x -= w
        return items[-1]


def watermark(prefix_max, i, lag):
    """The watermark when record `i` arrives, the source lagging `lag` records (None: none)."""
    j = i - lag
    return None if j < 0 else prefix_max[j] - OOO - 1


def fixed_windows(ts, size, slide):
    """The `[start, end)` windows of size `size` every `slide` that hold `ts`."""
    last = ts - ts % slide
    return [(s, s + size) for s in range(last, ts - size, -slide)]


def late_class(windows, wm, lateness):
    """Per window: 0 open, 1 fired but within `lateness` (re-emits), 2 late beyond it."""
    if wm is None:
        return [0] * len(windows)
    return [2 if end - 1 + lateness <= wm else 1 if end - 1 <= wm else 0 for _, end in windows]


def clicks(n, seed, size=60_000, slide=60_000, lateness=120_000, step=160):
    """`{page, ts}` page views: tumbling (slide == size) or sliding windows' input."""
    rng = Rng(seed)
    out, prefix_max = [], []
    top = T0
    for i in range(n):
        page = rng.weighted(PAGES, WEIGHTS)
        roll = rng.below(100)
        ts = top + rng.between(0, step)
        if roll < 10:
            ts = top - rng.between(0, OOO - 1000)
        elif roll < 13 and top - T0 > 6 * 60_000:
            cand = top - rng.between(40_000, 6 * 60_000)
            ws = fixed_windows(cand, size, slide)
            now = late_class(ws, watermark(prefix_max, i, 1), lateness)
            then = late_class(ws, watermark(prefix_max, i, LAG), lateness)
            if now == then and any(now):
                ts = cand
        top = max(top, ts)
        prefix_max.append(top)
        out.append({"page": page, "ts": ts})
    return out


def events(n, seed, users=40, gap=30_000, step=250):
    """`{user, amount, ts}`: users active in bursts (sessions), with bridges and late events."""
    rng = Rng(seed)
    out, prefix_max = [], []
    top = T0
    asleep = {}  # user -> event time it wakes up at
    burst = {}  # user -> event time its current (or last) burst started at
    last = {}  # user -> event time of its last event
    due = []  # (ts, user): a bridge's later end, then the bridge itself
    while len(out) < n:
        if due and due[0][0] <= top + step:
            ts, user = due.pop(0)
            if ts > top:  # the later burst's first event, then the bridge right after it
                prev = last[user]
                due.insert(0, ((prev + ts) // 2, user))
                burst[user] = ts
            else:
                asleep.pop(user, None)
        else:
            awake = [u for u in (f"u{k}" for k in range(users)) if asleep.get(u, 0) <= top]
            if not awake:
                top += step
                continue
            user = awake[rng.below(len(awake))]
            roll = rng.below(100)
            ts = top + rng.between(0, step)
            if roll < 10 and user in last:
                ts = max(last[user] - 1, top - rng.between(0, OOO - 1000))
            elif roll < 12 and top - T0 > 10 * 60_000:
                cand = top - rng.between(6 * 60_000, 9 * 60_000)
                ws = [(cand, cand + gap)]
                i = len(out)
                now = late_class(ws, watermark(prefix_max, i, 1), 0)
                then = late_class(ws, watermark(prefix_max, i, LAG), 0)
                if now == then == [2] and cand + gap < burst.get(user, T0) - 1000:
                    out.append({"user": user, "amount": rng.between(1, 50), "ts": cand})
                    prefix_max.append(top)
                    continue
            if user not in last or ts - last[user] > gap:
                burst[user] = ts
            if rng.below(6) == 0:
                if rng.below(3) == 0:
                    # A short pause, then a bridge: the next burst starts 1-4 s after the gap.
                    asleep[user] = 1 << 62
                    due.append((ts + gap + rng.between(1_000, 4_000), user))
                    due.sort()
                else:
                    asleep[user] = ts + gap + rng.between(5_000, 120_000)
        # No two events of a user exactly a gap apart: sessions that merely touch merge in
        # some engines and not in others.
        if any(r["user"] == user and abs(r["ts"] - ts) == gap for r in out[-600:]):
            ts += 1
        top = max(top, ts)
        last[user] = max(ts, last.get(user, ts))
        prefix_max.append(top)
        out.append({"user": user, "amount": rng.between(1, 50), "ts": ts})
    return out


def write_jsonl(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")


#: The committed inputs: path under data/, and how to make it.
COMMITTED = {
    "page_views/clicks.jsonl": lambda: clicks(6000, seed=15),
    "top_pages/views.jsonl": lambda: clicks(6000, seed=16, size=60_000, slide=30_000, lateness=0),
    "sessions/events.jsonl": lambda: events(3000, seed=17),
}


def main():
    args = sys.argv[1:]
    if not args:
        for rel, make in COMMITTED.items():
            write_jsonl(HERE / "data" / rel, make())
            print(f"wrote data/{rel}")
    elif len(args) in (3, 4) and args[0] in ("clicks", "events"):
        seed = int(args[3]) if len(args) == 4 else 1
        make = clicks if args[0] == "clicks" else events
        write_jsonl(Path(args[2]), make(int(args[1]), seed))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
