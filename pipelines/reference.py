#!/usr/bin/env python3
"""Sequential reference implementation of the reference pipelines.

Recomputes every file under `expected/` from the inputs under `data/`, with plain Python and
no dependencies, so that each golden output has a second, independent derivation:

    python3 pipelines/reference.py           # rewrite expected/
    python3 pipelines/reference.py --check   # exit 1 if expected/ is stale

Expected files are canonical JSON lines: keys sorted, no spaces, one record per line, lines
sorted, a trailing newline. A golden test canonicalises the engine's output the same way and
compares the two as multisets of lines.

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


def expected_files():
    files = {}
    for compute in (wordcount, orders_totals, two_pipelines, exactly_once, all_operators):
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
