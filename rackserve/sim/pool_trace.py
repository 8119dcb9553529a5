"""The pool's working set against its capacity over simulated time, sampled every `period_s`.

Working set: the bytes of distinct KV the deployment has put in the pool so far, a block put again
after it was evicted counted once (what a pool without a limit would hold); held: what the pool
holds now (committed and reserved, every tier); evictions: blocks evicted from each tier so far.
"""

from __future__ import annotations

from dataclasses import dataclass

TRACE_PERIOD_S = 10.0  # simulated seconds between samples (90 over AgentX's 900 s window)


@dataclass(frozen=True)
class PoolSample:
    t_s: float
    working_set_bytes: float
    held_bytes: float
    capacity_bytes: float
    evictions: int


class PoolTrace:
    """Samples of a pool (or of every pool of a scope, summed); `due(now)` is O(1)."""

    def __init__(self, period_s: float = TRACE_PERIOD_S) -> None:
        self.period_s = period_s
        self.working_set_bytes = 0.0
        self.samples: list[PoolSample] = []
        self._next_s = 0.0

    def put(self, new_bytes: float) -> None:
        """Bytes of blocks the pool never held before were written."""
        self.working_set_bytes += new_bytes

    def due(self, now: float) -> bool:
        return now >= self._next_s

    def record(self, now: float, held_bytes: float, capacity_bytes: float, evictions: int) -> None:
        self.samples.append(PoolSample(now, self.working_set_bytes, held_bytes, capacity_bytes, evictions))
        self._next_s = (now // self.period_s + 1) * self.period_s

    def to_dict(self) -> dict:
        """The samples as columns (the result's pool_trace); capacity is the last sample's."""
        s = self.samples
        return {"period_s": self.period_s, "t_s": [x.t_s for x in s],
                "working_set_bytes": [x.working_set_bytes for x in s], "held_bytes": [x.held_bytes for x in s],
                "capacity_bytes": s[-1].capacity_bytes if s else 0.0, "evictions_dropped": [x.evictions for x in s]}
