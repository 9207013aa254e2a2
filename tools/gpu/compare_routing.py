#!/usr/bin/env python3
"""Reads MoE routing dumps (LOCUS_ROUTING_DUMP=FILE, modules/moe_routing_dump.h) and says how
close each routing decision was, and with a second dump of the same prompts, where they differ.

One dump: per MoE layer, the smallest margins by which the tokens' choices were made: the k-th
chosen expert's selection score over the best one left out (among the kept groups), and the last
kept group's score over the best dropped group's. A margin near the size of the router logits'
rounding differences (about 1e-6 to 1e-5 between two backends' fp32 sums) means that two correct
implementations can choose differently there.

Two dumps (A then B, the same prompts; B the reference): per layer, the tokens whose chosen sets
differ, each with B's margins and the largest |logit difference| of that token between A and B.
A difference where B's margin is below the logit difference is a near-tie, not a bug. Exits 1 when
some token chose differently with a margin above it (a difference that rounding does not explain).

  python3 tools/gpu/compare_routing.py B.bin
  python3 tools/gpu/compare_routing.py A.bin B.bin
"""
import math
import struct
import sys


def read_dump(path):
    records = []
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        if data[pos:pos + 4] != b"LRD1":
            raise ValueError(f"{path}: bad record magic at byte {pos}")
        pos += 4
        (n,) = struct.unpack_from("<I", data, pos)
        pos += 4
        name = data[pos:pos + n].decode()
        pos += n
        t, e, k, n_group, topk_group, softmax, has_bias = struct.unpack_from("<7I", data, pos)
        pos += 28
        logits = struct.unpack_from(f"<{t * e}f", data, pos)
        pos += 4 * t * e
        bias = [0.0] * e
        if has_bias:
            bias = list(struct.unpack_from(f"<{e}f", data, pos))
            pos += 4 * e
        ids = struct.unpack_from(f"<{t * k}i", data, pos)
        pos += 4 * t * k
        records.append({"name": name, "t": t, "e": e, "k": k, "n_group": n_group, "topk_group": topk_group,
                        "softmax": bool(softmax), "bias": bias,
                        "logits": [logits[i * e:(i + 1) * e] for i in range(t)],
                        "ids": [ids[i * k:(i + 1) * k] for i in range(t)]})
    return records


def margins(rec, row):
    """(expert margin, group margin) of one token's routing, recomputed from its logits as
    ops::moe_route does (sigmoid + bias, group score = sum of the top two, top groups, top k)."""
    e, k, g, kg = rec["e"], rec["k"], rec["n_group"], rec["topk_group"]
    if rec["softmax"]:
        mx = max(row)
        s = [math.exp(v - mx) for v in row]
        total = sum(s)
        s = [v / total for v in s]
    else:
        s = [1.0 / (1.0 + math.exp(-v)) for v in row]
    sel = [a + b for a, b in zip(s, rec["bias"])]
    group_margin = math.inf
    kept = range(e)
    if g > 1 and kg < g:
        size = e // g
        scores = []
        for gi in range(g):
            top = sorted(sel[gi * size:(gi + 1) * size], reverse=True)
            scores.append(top[0] if rec["softmax"] else sum(top[:2]))
        order = sorted(range(g), key=lambda i: -scores[i])
        group_margin = scores[order[kg - 1]] - scores[order[kg]]
        kept_groups = set(order[:kg])
        kept = [x for x in range(e) if x // size in kept_groups]
    ranked = sorted((sel[x] for x in kept), reverse=True)
    expert_margin = ranked[k - 1] - ranked[k] if len(ranked) > k else math.inf
    return expert_margin, group_margin


def summarize(records):
    by_layer = {}
    for rec in records:
        for row in rec["logits"]:
            em, gm = margins(rec, row)
            lo = by_layer.setdefault(rec["name"], [math.inf, math.inf, 0])
            lo[0], lo[1], lo[2] = min(lo[0], em), min(lo[1], gm), lo[2] + 1
    for name, (em, gm, n) in by_layer.items():
        print(f"{name}: {n} tokens; smallest margin: experts {em:.3e}, groups {gm:.3e}")


def compare(a_records, b_records):
    if len(a_records) != len(b_records):
        print(f"the dumps hold {len(a_records)} and {len(b_records)} routing calls")
        return 2
    unexplained = 0
    for ra, rb in zip(a_records, b_records):
        if (ra["name"], ra["t"], ra["e"]) != (rb["name"], rb["t"], rb["e"]):
            print(f"call mismatch: {ra['name']} [{ra['t']}, {ra['e']}] vs {rb['name']} [{rb['t']}, {rb['e']}]")
            return 2
        for tok in range(rb["t"]):
            if set(ra["ids"][tok]) == set(rb["ids"][tok]):
                continue
            em, gm = margins(rb, rb["logits"][tok])
            diff = max(abs(x - y) for x, y in zip(ra["logits"][tok], rb["logits"][tok]))
            # A sigmoid score moves by at most a quarter of its logit's change, so an expert margin
            # closes by at most diff / 2 and a group margin (sums of two) by at most diff. A
            # softmax score s moves by at most 2 s diff (every logit moves), so a margin by 4 diff.
            near_tie = min(em, gm) <= (4 if rb["softmax"] else 1) * diff
            unexplained += 0 if near_tie else 1
            print(f"{rb['name']} token {tok}: experts {sorted(ra['ids'][tok])} vs {sorted(rb['ids'][tok])}; "
                  f"margins experts {em:.3e}, groups {gm:.3e}; max |logit difference| {diff:.3e} -> "
                  f"{'near-tie' if near_tie else 'NOT explained by rounding'}")
    print(f"{unexplained} routing differences not explained by rounding")
    return 1 if unexplained else 0


def main():
    if len(sys.argv) == 2:
        summarize(read_dump(sys.argv[1]))
        return 0
    if len(sys.argv) == 3:
        return compare(read_dump(sys.argv[1]), read_dump(sys.argv[2]))
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
