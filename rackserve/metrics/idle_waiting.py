"""Rank idle as an operator reads it: per rank, the time it has nothing to compute while requests
wait at another rank of its role (work it could have taken), beside the time it has nothing at all.

Not the lockstep share (a rank waiting at its instance's MoE barrier inside a step it takes part
in, rackserve_rank_idle_seconds): a rank counted here takes no part, or only an empty one.
Pure bookkeeping over a clock the caller gives (the simulator's, or the live wall clock in
simulated seconds); both clocks feed it the same (has work, has waiting) state per rank.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable

Window = Callable[[], tuple[float, float | None]]


def _overlap(a: float, b: float, start: float, end: float | None) -> float:
    hi = b if end is None else min(b, end)
    return max(0.0, hi - max(a, start))


class IdleWhileWaiting:
    """O(1) per state change: two clocks integrate "some rank of the role has a request waiting"
    and plain time over the window; a rank idle since clock value c has accrued (clock - c)."""

    def __init__(self, ranks: Iterable[Hashable], now: float = 0.0, window: Window | None = None) -> None:
        self._window = window or (lambda: (0.0, None))
        self._last = now
        self._waiting_clock = 0.0  # seconds with some request waiting
        self._clock = 0.0  # seconds
        self._waiting: set[Hashable] = set()
        self._idle_since: dict[Hashable, tuple[float, float]] = {}  # rank -> both clocks when it emptied
        self._acc: dict[Hashable, list[float]] = {}
        for rank in ranks:
            self._acc[rank] = [0.0, 0.0]
            self._idle_since[rank] = (0.0, 0.0)

    def _advance(self, now: float) -> None:
        if now <= self._last:
            return
        start, end = self._window()
        dt = _overlap(self._last, now, start, end)
        self._clock += dt
        if self._waiting:
            self._waiting_clock += dt
        self._last = now

    def update(self, now: float, rank: Hashable, has_work: bool, waiting: bool) -> None:
        """`rank` now has requests (waiting or running) or not, and some of them waiting or not."""
        self._advance(now)
        since = self._idle_since.get(rank)
        if has_work and since is not None:
            acc = self._acc[rank]
            acc[0] += self._waiting_clock - since[0]
            acc[1] += self._clock - since[1]
            del self._idle_since[rank]
        elif not has_work and since is None:
            self._idle_since[rank] = (self._waiting_clock, self._clock)
        if waiting:
            self._waiting.add(rank)
        else:
            self._waiting.discard(rank)

    def seconds(self, now: float) -> dict[Hashable, tuple[float, float]]:
        """Per rank: (idle while a request waited elsewhere, idle at all), in the window up to `now`."""
        self._advance(now)
        out = {}
        for rank, (waiting_s, empty_s) in self._acc.items():
            since = self._idle_since.get(rank)
            if since is not None:
                waiting_s += self._waiting_clock - since[0]
                empty_s += self._clock - since[1]
            out[rank] = (waiting_s, empty_s)
        return out
