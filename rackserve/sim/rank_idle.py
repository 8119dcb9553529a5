"""Idle as operators read it, on the simulator's clock: each prefill and decode rank's time with
nothing to compute while requests wait at another rank of its role (rackserve/metrics/idle_waiting.py),
fed from the ranks' schedulers wherever their queues change."""

from __future__ import annotations

from collections.abc import Callable

from rackserve.metrics.idle_waiting import IdleWhileWaiting
from rackserve.sim.instances import Instance


class RankIdleWatch:
    def __init__(self, prefill: list[Instance], decode: list[Instance],
                 window: Callable[[], tuple[float, float | None]]) -> None:
        self._instances = {"prefill": prefill, "decode": decode}
        self._watch = {role: IdleWhileWaiting([(i.name, r) for i in insts for r in range(len(i.ranks))], 0.0, window)
                       for role, insts in self._instances.items()}

    def changed(self, now: float, role: str, idx: int) -> None:
        """The queues of instance `idx` of `role` may have changed at `now`."""
        inst, watch = self._instances[role][idx], self._watch[role]
        for r, sched in enumerate(inst.ranks):
            watch.update(now, (inst.name, r), len(sched) > 0, bool(sched.waiting))

    def report(self, now: float, span_s: float) -> dict:
        """Per role the mean share of the window its ranks idled while work waited elsewhere (and
        idled at all), and per rank ("prefill-0/1") the first share."""
        out: dict = {"by_rank": {}}
        for role, watch in self._watch.items():
            secs = watch.seconds(now)
            n = max(len(secs), 1)
            out[f"{role}_idle_waiting_frac"] = sum(w for w, _ in secs.values()) / n / span_s if span_s else 0.0
            out[f"{role}_empty_frac"] = sum(e for _, e in secs.values()) / n / span_s if span_s else 0.0
            out["by_rank"].update({f"{k[0]}/{k[1]}": (w / span_s if span_s else 0.0) for k, (w, _) in secs.items()})
        return out
