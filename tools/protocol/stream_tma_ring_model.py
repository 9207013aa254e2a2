#!/usr/bin/env python3
"""A model of the NVFP4 streaming GEMM's TMA feed (src/backends/cuda/stream_gemm_tma_kernel.cu),
run under random interleavings to find a consumer warp that reads a stage before its weights and
activations landed, a copy that overwrites a stage still being read, or a deadlock.

W consumer warps each have a ring of D stages with a full and an empty barrier per stage (count 1
each). Producer lane w fills warp w's ring with warp w's chunks of the CTA's units in order: for
the first unit, the weights of its first min(D, chunks) chunks before the previous kernel has
ended (each stage's full barrier expects weights and activations at once), their activations
after it, then every further chunk with both. Consumer warps wait for the previous kernel, take
their chunks in order (stage k % D, phase parity (k / D) & 1), arrive on the stage's empty
barrier after reading it, and meet at a barrier of all W consumers at the end of every unit
(finish_unit). Barriers follow PTX mbarrier semantics (a phase completes when its arrivals are in
and its expected bytes landed; a wait on parity P returns once the phase's parity differs from P);
copies land in any order. After the early chunks a producer lane never blocks: each iteration it
polls its next stage and copies into it if it is free. The lanes run independently, or
(--lockstep) iteration by iteration together, as a converged warp does. Before each unit the
lanes meet (__syncwarp) and lane 0 hands the unit to the consumers through one of two slots
(full / empty barriers; then an end marker), once the consumers are done with the unit the slot
held; the consumers free a slot after their unit-end barrier. With --claimed (several domains:
units come from counters the previous kernel leaves) no unit is known before the previous kernel
ends, so nothing is copied early.

--fault names a deliberate bug, to show the model catches it:
  early-weights-only  the early stages expect only their weights' bytes;
  empty-parity        the producer waits on the empty barrier's parity of the use being filled;
  blocking-lanes      the kernel's first design: static units (no hand-over, the lanes never
                      meet) and a lane waits for its stage instead of polling (with --lockstep:
                      a deadlock once a CTA's units outnumber the ring's stages).

usage: tools/protocol/stream_tma_ring_model.py [--seeds N] [--lockstep] [--claimed] [--fault NAME]
"""
import random
import sys

from mbarrier_model import Barrier, interleave


def run(stages, units, rng, lockstep=False, fault=None, claimed=False):
    """units[u][w]: warp w's chunks in the CTA's unit u; `claimed`: the units come from counters
    (several domains), so none is known before the previous kernel ends. Returns an error string
    or None."""
    warps, n_units = len(units[0]), len(units)
    full = [[Barrier(1) for _ in range(stages)] for _ in range(warps)]
    empty = [[Barrier(1) for _ in range(stages)] for _ in range(warps)]
    unit_full, unit_empty = [Barrier(1) for _ in range(2)], [Barrier(1) for _ in range(2)]
    handed = [None, None]  # what each unit slot holds: a unit index, or n_units for "no more"
    # What a stage holds: (chunk id, "w" weights landed, "x" activations landed); chunk ids are
    # (unit, index) of warp w's chunks.
    holds = [[dict(chunk=None, w=False, x=False, reading=False) for _ in range(stages)] for _ in range(warps)]
    in_flight = []
    st = dict(previous_done=False, at_unit_end=[0] * n_units, at_boundary=[0] * (n_units + 1),
              published=[False] * (n_units + 1), iteration=[0] * warps, iterating=[False] * warps)

    def land(w, s, chunk, part):
        h = holds[w][s]
        assert h["chunk"] == chunk, "a copy landed in a stage refilled for another chunk"
        h[part] = True

    def copy(w, s, chunk, part):
        assert not holds[w][s]["reading"], f"warp {w}'s stage {s} overwritten while it was being read"
        in_flight.append((w, s, chunk, part))

    def boundary(w, u):  # the lanes meet before unit u (u = n_units: the end); lane 0 hands it over
        meet = fault != "blocking-lanes"  # the first design's lanes never met (static units)
        st["at_boundary"][u] += 1
        while meet and st["at_boundary"][u] < warps:
            yield
        if w == 0 and meet:
            j = u % 2
            if u >= 2:
                while not unit_empty[j].passed(((u // 2) - 1) & 1):
                    yield
            handed[j] = u
            unit_full[j].arrive()
            st["published"][u] = True
        while meet and not st["published"][u]:
            yield

    def lane(w):
        k = 0  # chunks issued
        early = 0 if claimed else min(stages, units[0][w])

        def issue(chunk, with_x, weights_only_expect=False):
            nonlocal k
            s = k % stages
            holds[w][s].update(chunk=chunk, w=False, x=False)
            full[w][s].expect(1 if weights_only_expect else 2)
            copy(w, s, chunk, "w")
            if with_x:
                copy(w, s, chunk, "x")
            k += 1

        for i in range(early):  # before the previous kernel ends: the stages are free
            issue((0, i), False, fault == "early-weights-only")
            yield
        while not st["previous_done"]:
            yield
        for i in range(early):
            copy(w, i % stages, (0, i), "x")
        for u in range(n_units):
            yield from boundary(w, u)
            i = early if u == 0 else 0
            it, iterating = st["iteration"], st["iterating"]
            iterating[w] = True
            while i < units[u][w]:  # one polling iteration per step
                if lockstep:  # the warp's lanes in a polling loop run their iterations together
                    it[w] += 1
                    while any(it[v] < it[w] and iterating[v] for v in range(warps)):
                        yield
                s = k % stages
                parity = (k // stages) & 1 if fault == "empty-parity" else ((k // stages) - 1) & 1
                if fault == "blocking-lanes":  # wait for the stage inside the iteration
                    while k >= stages and not empty[w][s].passed(parity):
                        yield
                if k < stages or empty[w][s].passed(parity):
                    issue((u, i), True)
                    i += 1
                yield
            iterating[w] = False  # out of the polling loop
        yield from boundary(w, n_units)

    def consumer(w):
        while not st["previous_done"]:
            yield
        k = 0
        first_design = fault == "blocking-lanes"  # static units: nothing handed over
        for u in range(n_units + 1):
            j = u % 2
            while not first_design and not unit_full[j].passed((u // 2) & 1):
                yield
            assert first_design or handed[j] == u, f"warp {w} took slot {j} holding {handed[j]} for unit {u}"
            if u == n_units:
                return
            for i in range(units[u][w]):
                s = k % stages
                while not full[w][s].passed((k // stages) & 1):
                    yield
                h = holds[w][s]
                assert h["chunk"] == (u, i), f"warp {w} took chunk {h['chunk']} for {(u, i)}"
                assert h["w"] and h["x"], f"warp {w} read chunk {(u, i)} before its {'x' if h['w'] else 'weights'} landed"
                h["reading"] = True
                yield  # the multiply
                h["reading"] = False
                empty[w][s].arrive()
                k += 1
            st["at_unit_end"][u] += 1
            while st["at_unit_end"][u] < warps:
                yield
            if w == 0 and not first_design:  # after finish_unit's last barrier: the slot is free
                unit_empty[j].arrive()

    def previous_kernel():
        for _ in range(rng.randrange(1, 40)):
            yield
        st["previous_done"] = True

    def land_copy(copy):
        w, s, chunk, part = copy
        land(w, s, chunk, part)
        full[w][s].land(1)

    actors = [previous_kernel()] + [lane(w) for w in range(warps)] + [consumer(w) for w in range(warps)]
    return interleave(actors, in_flight, land_copy, rng, 400000)


def random_units(rng, warps):
    """A CTA's units: 1-8 of them (one per CTA by default; more with a forced stream-K cut or
    rows too short for the row slots), each split over the warps as the kernel does (equal
    shares of a random length; some warps may get none)."""
    units = []
    for _ in range(rng.choice([1, 1, 2, 3, 5, 8])):
        length = rng.randrange(1, 6 * warps)
        units.append([length * (w + 1) // warps - length * w // warps for w in range(warps)])
    return units


def main():
    def option(name, default):
        return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default

    seeds, fault, lockstep = int(option("--seeds", 2000)), option("--fault", None), "--lockstep" in sys.argv
    claimed = "--claimed" in sys.argv
    warps = 4  # the kernel has 8; 4 keeps the runs short and covers the same interleavings
    for stages in range(2, 7):
        found = None
        for seed in range(seeds):
            rng = random.Random(seed)
            units = random_units(rng, warps)
            try:
                err = run(stages, units, rng, lockstep, fault, claimed)
            except AssertionError as e:
                err = str(e)
            if err:
                found = f"{err} (units {units}, seed {seed})"
                break
        print(f"{stages} stages{', lockstep lanes' if lockstep else ''}{', claimed units' if claimed else ''}"
              f"{', fault ' + fault if fault else ''}: "
              f"{'UNSOUND: ' + found if found else 'sound in every run'}")


if __name__ == "__main__":
    main()
