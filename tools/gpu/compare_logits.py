#!/usr/bin/env python3
"""Compares two `locus logits --out` dumps (same prompts): prints the worst relative error
||a - b|| / ||b|| over the records and exits 1 when it is not below the tolerance (default 2e-2,
the end-to-end BF16 budget of DESIGN.md section 7), 2 when the dumps do not match in shape.

  python3 tools/gpu/compare_logits.py A.bin B.bin [--tol 2e-2] [--label "cuda vs cpu"]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parity"))
from hf_parity import read_logits_file, rel_error  # noqa: E402  (stdlib only; no torch needed)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--tol", type=float, default=2e-2)
    ap.add_argument("--label", default="logits")
    args = ap.parse_args()
    a, b = read_logits_file(args.a), read_logits_file(args.b)
    if len(a) != len(b) or any(ra[:2] != rb[:2] for ra, rb in zip(a, b)):
        print(f"{args.label}: the dumps differ in shape ({[r[:2] for r in a]} vs {[r[:2] for r in b]})")
        return 2
    worst = max(rel_error(ra[2], rb[2]) for ra, rb in zip(a, b))
    ok = worst < args.tol
    print(f"{args.label}: max rel error {worst:.3e} over {len(a)} prompts (tol {args.tol:g}) {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
