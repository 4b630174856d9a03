#!/usr/bin/env python3
"""Sequential reference implementation of the reference pipelines.

Recomputes every file under `expected/` from the inputs under `data/`, with plain Python and
no dependencies, so that each golden output has a second, independent derivation:

    python3 pipelines/reference.py           # rewrite expected/
    python3 pipelines/reference.py --check   # exit 1 if expected/ is stale

Expected files are canonical JSON lines: keys sorted, no spaces, one record per line, lines
sorted, a trailing newline. A golden test canonicalises the engine's output the same way and
compares the two as multisets of lines.

The event-time pipelines (page_views, top_pages, sessions) are simulated record by record with
their watermarks, windows and lateness; each output is computed with the watermark lagging 1
and LAG records behind the arrivals, and the two must agree (see README.md).

Not covered, on purpose: outputs that depend on the generator's pseudo-random sequence
(`two_pipelines.yaml`, pipeline `synthetic`) and the exact error text of dead-letter records
(`all_operators.yaml`, sink `errors`); see README.md.
"""

import json
import re
import sys
from collections import OrderedDict
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
EXPECTED = HERE / "expected"


def canonical(record):
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def render(records):
    return "".join(line + "\n" for line in sorted(canonical(r) for r in records))


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def wordcount():
    """flat_map into lowercase [a-z0-9]+ words, key by word, count, emit final."""
    counts = OrderedDict()
    with open(DATA / "wordcount" / "input.txt", encoding="utf-8") as f:
        for line in f:
            for word in re.findall(r"[a-z0-9]+", line.rstrip("\n").lower()):
                counts[word] = counts.get(word, 0) + 1
    return {("wordcount", "wordcount", "counts"): [{"key": w, "count": n} for w, n in counts.items()]}


def orders_totals():
    """Key by user; sum and count of amount; emit final (benchmark W1)."""
    totals = OrderedDict()
    for r in read_jsonl(DATA / "orders_totals" / "orders.jsonl"):
        s, c = totals.get(r["user"], (0, 0))
        totals[r["user"]] = (s + r["amount"], c + 1)
    out = [{"key": u, "sum": s, "count": c} for u, (s, c) in totals.items()]
    return {("orders_totals", "orders_totals", "totals_out"): out}


def two_pipelines():
    """big_orders: keep orders with amount > 90. (synthetic: generator-fed, not computed.)"""
    big = [r for r in read_jsonl(DATA / "two_pipelines" / "orders.jsonl") if r["amount"] > 90]
    return {("two_pipelines", "big_orders", "big"): big}


def exactly_once():
    """Map to a one-reading summary, key by sensor, reduce with emit: updates."""
    acc = {}
    out = []
    for r in read_jsonl(DATA / "exactly_once" / "readings.jsonl"):
        summary = {"sensor": r["sensor"], "readings": 1, "total": r["celsius"], "max": r["celsius"]}
        prev = acc.get(summary["sensor"])
        if prev is None:
            new = summary  # a key's first record is its initial accumulator
        else:
            new = {
                "sensor": prev["sensor"],
                "readings": prev["readings"] + summary["readings"],
                "total": prev["total"] + summary["total"],
                "max": summary["max"] if summary["max"] > prev["max"] else prev["max"],
            }
        acc[summary["sensor"]] = new
        out.append({"key": summary["sensor"], **new})
    return {("exactly_once", "sensor_summaries", "summaries"): out}


def all_operators():
    """Every operator type; see all_operators.yaml for the graph."""
    parsed_web = []
    for r in read_jsonl(DATA / "all_operators" / "web.jsonl"):
        if not is_int(r["amount"]):
            continue  # parse_web throws: dead-lettered to `errors`
        parsed_web.append({"user": r["user"], "amount": r["amount"], "items": r["items"], "channel": "web"})
    tagged_store = [
        {"user": r["user"], "amount": r["amount"], "items": r["items"], "channel": "store"}
        for r in read_jsonl(DATA / "all_operators" / "store.jsonl")
    ]
    # The union interleaves its inputs in no fixed order; every keyed result below depends only
    # on the order within one input, which is preserved.
    valid = [r for r in parsed_web + tagged_store if r["amount"] > 0]

    per_user = OrderedDict()
    for r in valid:
        per_user.setdefault(r["user"], []).append(r["amount"])
    totals = [
        {
            "key": u,
            "total": sum(a),
            "orders": len(a),
            "smallest": min(a),
            "largest": max(a),
            "mean": float(sum(a)) / len(a),
        }
        for u, a in per_user.items()
    ]

    largest = OrderedDict()
    for r in valid:  # each channel's records come from one input, in file order
        acc = largest.get(r["channel"])
        largest[r["channel"]] = r if acc is None or r["amount"] > acc["amount"] else acc
    largest_out = [{"channel_key": k, **acc} for k, acc in largest.items()]

    seen = {}
    seen_out = []
    for r in valid:
        for item in r["items"]:
            c = seen.get(item, 0)
            seen[item] = c + 1
            seen_out.append({"item": item, "seen": c + 1})

    return {
        ("all_operators", "shop", "totals_out"): totals,
        ("all_operators", "shop", "largest_out"): largest_out,
        ("all_operators", "shop", "seen_out"): seen_out,
    }


# ---------------------------------------------------------------------------------------------
# Event time (page_views, top_pages, sessions): watermarks, windows, lateness, timers.
#
# Semantics (Flink's): a source's watermark is the largest event time it has read minus
# `max_out_of_orderness` minus 1 ms; each pipeline here reads one file with one reader, and
# its `key_by` runs at parallelism 1, so every window subtask has one input channel and sees
# the records and the watermarks in file order. A window `[start, end)` closes (emits) when the
# watermark reaches `end - 1`; a record is late for a window when `end - 1 + allowed_lateness
# <= watermark` at its arrival (dropped, or sent to the `late:` sink when no window takes it);
# a record for a closed window within the allowed lateness updates it and re-emits its result.
#
# When the watermark reaches an operator depends on how the source batches its output (and on
# where a restore cut the batches), so the data was made (event_data.py) such that it does not
# matter: every output below is computed twice, with the watermark lagging 1 record and LAG
# records behind the arrivals, and the two must be equal. Lateness is monotonic in the
# watermark, so any lag in between gives the same output too.

LAG = 1100  # records; above the runtime's batch size (1024)
OOO = 5_000  # ms; every event-time pipeline here has `max_out_of_orderness: 5s`


def with_watermarks(records, lag):
    """Each record with the watermark at its arrival (None before any), lagging `lag` records."""
    top = None
    seen = []
    for i, r in enumerate(records):
        j = i - lag
        yield r, (None if j < 0 else seen[j] - OOO - 1)
        top = r["ts"] if top is None else max(top, r["ts"])
        seen.append(top)


def reached(wm, t):
    """Whether watermark `wm` has reached time `t`."""
    return wm is not None and t <= wm


def fixed_windows(records, key, size, slide, lateness, init, add, result, lag):
    """Tumbling (slide == size) or sliding windows per key, `emit: on_close`.

    Returns (window results, records no window took)."""
    windows = {}  # (key, start) -> [acc, had an on-time record, emitted on close]
    out, late = [], []
    for r, wm in with_watermarks(records, lag):
        k, ts = r[key], r["ts"]
        taken = False
        for start in range(ts - ts % slide, ts - size, -slide):
            end = start + size
            if reached(wm, end - 1 + lateness):
                continue
            w = windows.setdefault((k, start), [init(), False, False])
            if reached(wm, end - 1):
                if w[1] and not w[2]:
                    out.append(result(k, start, end, w[0]))  # closed before this record came
                    w[2] = True
                w[0] = add(w[0], r)
                out.append(result(k, start, end, w[0]))  # the late record's re-emission
                w[2] = True
            else:
                w[0] = add(w[0], r)
                w[1] = True
            taken = True
        if not taken:
            late.append(r)
    for (k, start), (acc, on_time, emitted) in windows.items():
        if on_time and not emitted:
            out.append(result(k, start, start + size, acc))
    return out, late


def sessions_of(records, key, gap, init, add, merge, result, lag):
    """Session windows per key, `allowed_lateness: 0s`: a record opens `[ts, ts + gap)` and
    merges with every open session it overlaps."""
    open_ = {}  # key -> [[start, end, acc]]
    out, late = [], []
    for r, wm in with_watermarks(records, lag):
        for k, ss in open_.items():
            for s in [s for s in ss if reached(wm, s[1] - 1)]:
                out.append(result(k, s[0], s[1], s[2]))
                ss.remove(s)
        k, ts = r[key], r["ts"]
        ss = open_.setdefault(k, [])
        # Sessions that only touch would merge in Flink (and maybe not elsewhere): the data
        # has none, so both rules give the same sessions.
        assert all(s[1] != ts and ts + gap != s[0] for s in ss), (k, ts)
        over = [s for s in ss if s[0] < ts + gap and ts < s[1]]
        if reached(wm, ts + gap - 1):
            # Late whether lateness is judged on the record's own window or the merged one.
            assert not over, (k, ts)
            late.append(r)
            continue
        acc = add(init(), r)
        start, end = ts, ts + gap
        for s in over:
            ss.remove(s)
            start, end, acc = min(start, s[0]), max(end, s[1]), merge(s[2], acc)
        ss.append([start, end, acc])
    for k, ss in open_.items():
        for s in ss:
            out.append(result(k, s[0], s[1], s[2]))
    return out, late


def deterministic(compute):
    """`compute(lag)` at lag 1 and LAG, which must agree (as multisets); its lag-1 result."""
    a, b = compute(1), compute(LAG)
    for x, y in zip(a, b):
        assert render(x) == render(y), f"{compute.__name__}: the output depends on the lag"
    return a


def page_views():
    """Views per page per minute: tumbling 1 min, allowed lateness 2 min, late to a sink."""
    clicks = read_jsonl(DATA / "page_views" / "clicks.jsonl")

    def compute(lag):
        return fixed_windows(
            clicks, "page", 60_000, 60_000, 120_000,
            init=lambda: 0,
            add=lambda n, r: n + 1,
            result=lambda k, s, e, n: {"key": k, "window_start": s, "window_end": e, "views": n},
            lag=lag,
        )

    views, late = deterministic(compute)
    return {
        ("page_views", "page_views", "views"): views,
        ("page_views", "page_views", "late_clicks"): late,
    }


def top_pages():
    """Views per page in 1-min windows sliding by 30 s; per window, the most viewed page (ties:
    the first page name), emitted by an event-time timer at the window's end."""
    views = read_jsonl(DATA / "top_pages" / "views.jsonl")

    def compute(lag):
        counts, _ = fixed_windows(
            views, "page", 60_000, 30_000, 0,
            init=lambda: 0,
            add=lambda n, r: n + 1,
            result=lambda k, s, e, n: (s, e, k, n),
            lag=lag,
        )
        best = {}
        for s, e, page, n in counts:
            b = best.get((s, e))
            if b is None or n > b[1] or (n == b[1] and page < b[0]):
                best[(s, e)] = (page, n)
        top = [
            {"window_start": s, "window_end": e, "page": p, "views": n}
            for (s, e), (p, n) in best.items()
        ]
        return (top,)

    (top,) = deterministic(compute)
    return {("top_pages", "top_pages", "top_out"): top}


def sessions():
    """Sessions per user (gap 30 s): events, total and largest amount; late events dropped."""
    events = read_jsonl(DATA / "sessions" / "events.jsonl")

    def compute(lag):
        out, _ = sessions_of(
            events, "user", 30_000,
            init=lambda: (0, 0, 0),
            add=lambda a, r: (a[0] + 1, a[1] + r["amount"], max(a[2], r["amount"])),
            merge=lambda a, b: (a[0] + b[0], a[1] + b[1], max(a[2], b[2])),
            result=lambda k, s, e, a: {
                "key": k, "window_start": s, "window_end": e,
                "events": a[0], "spent": a[1], "largest": a[2],
            },
            lag=lag,
        )
        return (out,)

    (out,) = deterministic(compute)
    return {("sessions", "sessions", "sessions_out"): out}


def expected_files():
    files = {}
    for compute in (
        wordcount, orders_totals, two_pipelines, exactly_once, all_operators,
        page_views, top_pages, sessions,
    ):
        for (name, pipeline, sink), records in compute().items():
            files[EXPECTED / name / pipeline / f"{sink}.jsonl"] = render(records)
    return files


def main():
    check = sys.argv[1:] == ["--check"]
    if sys.argv[1:] not in ([], ["--check"]):
        sys.exit(__doc__)
    stale = []
    for path, text in sorted(expected_files().items()):
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if check:
            stale.append(path.relative_to(HERE))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(HERE)}")
    if stale:
        print("stale expected files (run python3 pipelines/reference.py):", *stale, sep="\n  ")
        sys.exit(1)


if __name__ == "__main__":
    main()
