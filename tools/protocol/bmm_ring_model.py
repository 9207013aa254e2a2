#!/usr/bin/env python3
"""A model of the BMM TMA kernel's slot protocol (src/backends/cuda/bmm_tma_kernel.cu), run under
random interleavings to find a consumer that reads a slot or an x buffer before its copy landed.

One producer copies units (activations into one of XB x buffers, then the unit's weight slots into
a ring of S slots) and finishes with one sentinel slot per consumer group; G consumer groups of W
warps take items g, g + G, ... Barriers follow PTX mbarrier semantics: a phase completes when its
arrivals are in and its expected bytes landed; a wait on parity P returns once the current phase's
parity differs from P. Copies land in any order, as TMA copies do. Before the previous kernel ends the producer may copy
its first units' weights (early copies: none, a slot per group, the whole ring), their
activations after it.

usage: tools/protocol/bmm_ring_model.py [--groups G] [--seeds N]
       (prints, per ring size, whether it is sound; the kernel has 2 groups)
"""
import random
import sys

from mbarrier_model import Barrier, interleave


def run(slots, groups, warps, x_buffers, unit_slots, rng, early=0):
    w_full = [Barrier(1) for _ in range(slots)]
    w_empty = [Barrier(warps) for _ in range(slots)]
    x_full = [Barrier(1) for _ in range(x_buffers)]
    x_empty = [Barrier(warps * groups) for _ in range(x_buffers)]
    info, slot_holds, x_holds, in_flight = [None] * slots, [None] * slots, [None] * x_buffers, []
    st = dict(item=0, xi=0)

    def open_unit():  # the next x buffer, once its consumers freed it; returns (buffer, fill parity)
        xb = st["xi"] % x_buffers
        if st["xi"] >= x_buffers:
            while not x_empty[xb].passed((st["xi"] // x_buffers - 1) & 1):
                yield
        parity = (st["xi"] // x_buffers) & 1
        st["xi"] += 1
        return xb, parity

    def copy_x(xb, unit):
        x_full[xb].expect(1)
        in_flight.append((x_full[xb], x_holds, xb, unit))

    def copy_slot(unit, j, xb, parity):  # slot j of `unit`, once its consumers freed it
        item, n = st["item"], unit_slots[unit]
        sl = item % slots
        if item >= slots:
            while not w_empty[sl].passed((item // slots - 1) & 1):
                yield
        releases = (j >= n - groups) + (max(0, groups - n) if j == n - 1 else 0)
        info[sl] = dict(item=item, unit=unit, xb=xb, x_parity=parity, releases=releases)
        w_full[sl].expect(1)
        in_flight.append((w_full[sl], slot_holds, sl, item))
        st["item"] += 1
        yield

    def producer():
        # Before the previous kernel ends (`early` > 0): whole units' weights, as far as the ring
        # takes them without waiting, until `early` slots are filled; their activations after.
        unit, owed, cur = 0, [], None
        while unit < len(unit_slots) and st["xi"] < x_buffers and st["item"] < min(early, slots):
            xb, parity = yield from open_unit()
            owed.append((xb, unit))
            cur = [unit, xb, parity, 0]
            unit += 1
            while cur[3] < unit_slots[cur[0]] and st["item"] < slots:
                yield from copy_slot(cur[0], cur[3], cur[1], cur[2])
                cur[3] += 1
        yield  # the wait for the previous kernel
        for xb, u in owed:
            copy_x(xb, u)
        while cur and cur[3] < unit_slots[cur[0]]:
            yield from copy_slot(cur[0], cur[3], cur[1], cur[2])
            cur[3] += 1
        for u in range(unit, len(unit_slots)):
            xb, parity = yield from open_unit()
            copy_x(xb, u)
            for j in range(unit_slots[u]):
                yield from copy_slot(u, j, xb, parity)
        for _ in range(groups):
            item = st["item"]
            sl = item % slots
            if item >= slots:
                while not w_empty[sl].passed((item // slots - 1) & 1):
                    yield
            info[sl] = dict(item=item, last=True)
            w_full[sl].arrive()
            st["item"] += 1
            yield

    def warp(group):
        item = group
        while True:
            sl = item % slots
            while not w_full[sl].passed((item // slots) & 1):
                yield
            slot = info[sl]
            assert slot is not None, f"a group-{group} warp read slot {sl} before its first copy was asked for"
            assert slot["item"] == item, f"a group-{group} warp took item {slot['item']}'s slot for item {item}"
            if slot.get("last"):
                return
            while not x_full[slot["xb"]].passed(slot["x_parity"]):
                yield
            assert slot_holds[sl] == item, f"item {item}'s slot read before its copy landed"
            assert x_holds[slot["xb"]] == slot["unit"], f"unit {slot['unit']}'s activations read before they landed"
            yield  # the multiply
            w_empty[sl].arrive()
            if slot["releases"]:
                x_empty[slot["xb"]].arrive(slot["releases"])
            item += groups

    def land(copy):
        barrier, holds, index, value = copy
        holds[index] = value
        barrier.land(1)

    actors = [producer()] + [warp(g) for g in range(groups) for _ in range(warps)]
    return interleave(actors, in_flight, land, rng, 200000)


def main():
    def option(name, default):
        return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default

    seeds, groups = option("--seeds", 200), option("--groups", 2)
    units = ([4, 4], [1, 1, 1, 1], [8], [2, 3, 1, 4])  # slots per unit, one CTA's units
    for slots in range(2, 9):
        found = None
        cases = [(u, xb, e) for u in units for xb in (1, 2) for e in (0, groups, slots)]
        for unit_slots, x_buffers, early in cases:
            for seed in range(seeds):
                try:
                    err = run(slots, groups, 4, x_buffers, unit_slots, random.Random(seed), early)
                except AssertionError as e:
                    err = str(e)
                if err:
                    found = f"{err} (units {unit_slots}, {x_buffers} x buffers, {early} slots early, seed {seed})"
                    break
            if found:
                break
        print(f"{slots} slots, {groups} groups: {'UNSOUND: ' + found if found else 'sound in every run'}")


if __name__ == "__main__":
    main()
