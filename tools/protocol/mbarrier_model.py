"""What the kernels' protocol models (bmm_ring_model.py, stream_tma_ring_model.py) share: PTX
mbarrier semantics (a phase completes when its arrivals are in and every expected byte, the
transaction count, has landed; a wait on parity P returns once the current phase's parity differs
from P) and the random interleaving of the actors with the landing of copies."""


class Barrier:
    def __init__(self, count):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def _complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase, self.pending = self.phase + 1, self.count

    def arrive(self, n=1):
        self.pending -= n
        assert self.pending >= 0, "more arrivals than the barrier's count"
        self._complete()

    def expect(self, nbytes):  # arrive.expect_tx
        self.tx += nbytes
        self.arrive()

    def land(self, nbytes):  # a copy's complete_tx
        self.tx -= nbytes
        self._complete()

    def passed(self, parity):  # try_wait.parity / test_wait.parity
        return (self.phase & 1) != parity


def interleave(actors, in_flight, land, rng, steps):
    """Runs `actors` (generators; each next() is one step) and lands the copies in `in_flight`
    (each by land(copy)), one at a time in random order, until all are done (None) or `steps`
    have passed (a deadlock: an error string)."""
    for _ in range(steps):
        if not actors and not in_flight:
            return None
        k = rng.randrange(len(actors) + len(in_flight))
        if k < len(actors):
            try:
                next(actors[k])
            except StopIteration:
                actors.pop(k)
        else:
            land(in_flight.pop(k - len(actors)))
    return "no progress (a deadlock)"
