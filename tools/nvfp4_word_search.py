#!/usr/bin/env python3
"""Searches for cheap ways to decode the CUDA kernels' NVFP4 layout words (nvfp4_layout.h).

A pair of e2m1 codes becomes bf16x2 bits when its 8 bits sit under the mask 0x81C081C0 (b0..b2 at
6..8 and the sign at 15, the same + 16). The packer may put each pair's bits anywhere in the
lane's 128 bits (four words); the kernel then pays per pair one AND, plus what moves the bits
under the mask. This script checks two things (about a minute):

1. No "window" tiles the 128 bits: a rotation or funnel shift of two words, or a byte permute
   (PRMT) of two words, each followed by the mask, cannot give all 16 pairs (so some pair needs
   more than a shift and an AND; within one word no four moves tile it either).
2. Which layouts decode three pairs of a word by rotations and the fourth by an AND, one integer
   multiply (several left shifts at once, no carries under the mask) and an AND.

usage: tools/nvfp4_word_search.py
"""
import itertools
import sys

MASK_BITS = [6, 7, 8, 15, 22, 23, 24, 31]
MASK = sum(1 << b for b in MASK_BITS)


def rotl(x, r):
    return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF if r else x


def windows():
    """Every single-instruction move of a pair onto the mask: {source bit mask: name}."""
    out = {}

    def add(name, src):
        if len(set(src)) == 8:
            out.setdefault(sum(1 << b for b in src), name)

    for i in range(4):
        for j in range(4):
            for r in range(32):
                if r == 0 and i != j:
                    continue
                add(("funnel", i, j, r), [32 * i + x + r if x < 32 - r else 32 * j + x + r - 32 for x in MASK_BITS])
    for i in range(4):
        for j in range(i, 4):
            for sel in itertools.product(range(8), repeat=4):
                byte_src = [(i if s < 4 else j) * 4 + s % 4 for s in sel]
                add(("prmt", i, j, sel), [8 * byte_src[x // 8] + x % 8 for x in MASK_BITS])
    return out


def exact_cover_exists(wins):
    by_bit = [[m for m in wins if m >> b & 1] for b in range(128)]
    full = (1 << 128) - 1

    def dfs(used):
        if used == full:
            return True
        b = next(x for x in range(128) if not used >> x & 1)
        return any(not used & m and dfs(used | m) for m in by_bit[b])

    return dfs(0)


def multiply_layouts():
    """(r1, r2, pair-3 bits, shifts, bit map): pairs 1, 2 rotated by r1, r2; pair 3 by a multiply."""
    found = []
    for r1 in range(1, 32):
        for r2 in range(r1 + 1, 32):
            m1, m2 = rotl(MASK, r1), rotl(MASK, r2)
            if MASK & m1 or MASK & m2 or m1 & m2:
                continue
            rest = 0xFFFFFFFF ^ (MASK | m1 | m2)
            src = [b for b in range(32) if rest >> b & 1]
            for terms in (1, 2, 3):
                for shifts in itertools.combinations(range(32), terms):
                    k = sum(1 << s for s in shifts)
                    images = {}
                    for b in src:
                        u = ((1 << b) * k) & 0xFFFFFFFF & MASK
                        if bin(u).count("1") == 1:
                            images[b] = u.bit_length() - 1
                        elif u:
                            break
                    else:
                        if sorted(images.values()) != MASK_BITS:
                            continue
                        ok = all(((x * k) & 0xFFFFFFFF & MASK) == sum(1 << images[b] for b in src if x >> b & 1)
                                 for x in (sum(1 << src[i] for i in range(8) if p >> i & 1) for p in range(256)))
                        if ok:
                            found.append((r1, r2, hex(rest), shifts, images))
    return found


def main():
    wins = windows()
    print(f"{len(wins)} distinct windows; an exact cover of the 128 bits exists: {exact_cover_exists(wins)}")
    sys.stdout.flush()
    for layout in multiply_layouts():
        print("rotations 0, %d, %d; pair 3 at %s, shifts %s, bit map %s" % layout)


if __name__ == "__main__":
    main()
