#!/usr/bin/env python3
"""Inputs and checks of the two scripted-state workloads beside W4 (bench/weir/wstate.sh).

    wstate.py skew N OUT.jsonl        W4 records ({user, amount, ts}) whose users follow a
                                      Zipf-like law over N distinct users (a few hot users, a
                                      long tail of cold ones); W4's own check4.py checks them
    wstate.py fields N OUT.jsonl      {user, item, amount}: 1000 users, 64 items each
    wstate.py wide N OUT.jsonl        the same records for 50 users of 5000 items each (maps of
                                      thousands of fields)
    wstate.py check-fields IN OUT     checks wfields.yaml.in's output: per user the record
                                      count and the sum of amounts per item, exact

Deterministic (a fixed seed), so that every run measures the same input.
"""
import bisect, itertools, json, os, random, sys


def skew(n, out):
    rng = random.Random(19)
    # P(rank k) ~ 1 / k^0.8 over n users: cumulative weights, then bisect.
    cum = list(itertools.accumulate(1.0 / (k ** 0.8) for k in range(1, n + 1)))
    total = cum[-1]
    with open(out, "w") as f:
        for i in range(n):
            u = bisect.bisect_left(cum, rng.random() * total)
            f.write(f'{{"user":"u{u}","amount":{rng.randint(1, 100)},"ts":{1700000000000 + i}}}\n')


def fields(n, out, users=1000, items=64):
    rng = random.Random(23)
    with open(out, "w") as f:
        for _ in range(n):
            f.write(f'{{"user":"u{rng.randrange(users)}","item":"i{rng.randrange(items)}","amount":{rng.randint(1, 100)}}}\n')


def lines(path):
    files = [path] if os.path.isfile(path) else sorted(
        os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if not f.startswith("."))
    for p in files:
        with open(p) as f:
            yield from (l for l in f if l.strip())


def check_fields(inp, out):
    count, items = {}, {}
    for l in lines(inp):
        r = json.loads(l)
        u = r["user"]
        count[u] = count.get(u, 0) + 1
        m = items.setdefault(u, {})
        m[r["item"]] = m.get(r["item"], 0) + r["amount"]
    got, dup = {}, 0
    for l in lines(out):
        r = json.loads(l)
        dup += r["key"] in got
        got[r["key"]] = r
    wrong = sum(1 for u in count if u not in got or got[u].get("count") != count[u]
                or dict(got[u].get("items", {})) != items[u])
    extra = sum(1 for k in got if k not in count)
    ok = not (dup or wrong or extra)
    print(f"{'OK' if ok else 'FAIL'} fields: {len(got)} keys; expected {len(count)}; "
          f"duplicates={dup} wrong/missing={wrong} extra={extra}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "skew":
        skew(int(sys.argv[2]), sys.argv[3])
    elif what == "fields":
        fields(int(sys.argv[2]), sys.argv[3])
    elif what == "wide":
        fields(int(sys.argv[2]), sys.argv[3], users=50, items=5000)
    elif what == "check-fields":
        check_fields(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
