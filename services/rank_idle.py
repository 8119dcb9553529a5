"""The live clock's idle as operators read it: every rank of one worker process (all its instances
of one role), the time it had nothing to compute while requests waited at another of its ranks,
counted into rackserve_rank_idle_while_waiting_seconds (rackserve/metrics/idle_waiting.py).

The clock is the process's simulated time: the furthest of its instances' clocks (each counts its
own steps; an instance with nothing to do does not step, and then it is another that has waiting
work, if any does, whose steps carry the time on)."""

from __future__ import annotations

from rackserve.metrics import ProcessMetrics, RankKey
from rackserve.metrics.idle_waiting import IdleWhileWaiting


class RankIdleExport:
    def __init__(self, metrics: ProcessMetrics, keys: list[RankKey]) -> None:
        self._counter = metrics.ranks.idle_while_waiting
        self._watch = IdleWhileWaiting(keys)
        self._exported = dict.fromkeys(keys, 0.0)
        self.clock_s = 0.0
        for key in keys:
            self._counter.labels(**key.labels())  # every rank's series from the start, at 0

    def observe(self, sim_now_s: float, states: dict[RankKey, tuple[bool, bool]]) -> None:
        """From an instance's clock at `sim_now_s` on, each of its ranks has work or not, and
        requests waiting or not; the counter takes what every rank accrued up to then."""
        self.clock_s = max(self.clock_s, sim_now_s)
        for key, (has_work, waiting) in states.items():
            self._watch.update(self.clock_s, key, has_work, waiting)
        for key, (seconds, _) in self._watch.seconds(self.clock_s).items():
            delta = seconds - self._exported[key]
            if delta > 0:
                self._counter.labels(**key.labels()).inc(delta)
                self._exported[key] = seconds
