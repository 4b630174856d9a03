"""The memory benchmark's workload on Bytewax 0.21 (bench/weir/mem.sh): per user, a dict of
how many records fell in each amount decile, emitted once per user at end of input.

    python -m bytewax.testing "bw_mem:get_flow('IN.jsonl', 'OUT.jsonl')" -p 2 -r REC -s 1 -b 0
"""
import json

import bytewax.operators as op
from bytewax.connectors.files import FileSink, FileSource
from bytewax.dataflow import Dataflow


def kv(r):
    return r["user"], r["amount"]


def fold(acc, a):
    d = str((a - 1) // 10)
    acc[d] = acc.get(d, 0) + 1
    return acc


def fmt(kvp):
    key, acc = kvp
    return key, json.dumps({"key": key, "deciles": acc})


def get_flow(inp, out):
    flow = Dataflow("mem")
    recs = op.map("kv", op.map("parse", op.input("in", flow, FileSource(inp)), json.loads), kv)
    totals = op.fold_final("deciles", recs, dict, fold)
    op.output("out", op.map("fmt", totals, fmt), FileSink(out))
    return flow
