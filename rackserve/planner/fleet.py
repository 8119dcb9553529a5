"""The instances a planner steers and their states: off -> starting (weights load, warm-up) ->
active (routable) -> draining (no new requests; running ones finish) -> off. A draining instance
asked back is active again at once (it never unloaded); a starting one no longer wanted stops.
GPUs are held from the start of `starting` to the end of `draining` (`held`: a step function)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rackserve.planner.observation import Targets

OFF, STARTING, ACTIVE, DRAINING = "off", "starting", "active", "draining"


@dataclass(eq=False)
class InstanceSlot:
    name: str
    role: str
    index: int  # the instance's place in its role's list (the simulator's index)
    gpus: int
    state: str = OFF
    ready_at: float = 0.0  # starting: when it becomes routable


@dataclass(frozen=True)
class Change:
    slot: InstanceSlot
    to: str  # the new state


class Fleet:
    def __init__(self, slots: list[InstanceSlot]) -> None:
        self.slots = slots
        self.held: list[tuple[float, int]] = [(0.0, self.held_gpus())]  # (from t, GPUs held)

    def role(self, role: str, *states: str) -> list[InstanceSlot]:
        return [s for s in self.slots if s.role == role and (not states or s.state in states)]

    def planned(self, role: str) -> int:
        """Instances that will serve: active or starting (draining ones are on their way out)."""
        return len(self.role(role, ACTIVE, STARTING))

    def held_gpus(self) -> int:
        return sum(s.gpus for s in self.slots if s.state != OFF)

    def activate_now(self, slot: InstanceSlot, now: float) -> None:
        """Active from `now` without a start-up (the deployment as it stands at t=0)."""
        self._set(slot, ACTIVE, now)

    def apply(self, targets: Targets, now: float, startup_s: Callable[[InstanceSlot], float],
              drain_order: Callable[[InstanceSlot], float]) -> list[Change]:
        """Move towards `targets`; the changes made (starting slots carry their ready_at)."""
        out: list[Change] = []
        for role, want in (("prefill", targets.prefill), ("decode", targets.decode)):
            out += self._scale(role, want, now, startup_s, drain_order)
        return out

    def _scale(self, role: str, want: int, now: float, startup_s: Callable[[InstanceSlot], float],
               drain_order: Callable[[InstanceSlot], float]) -> list[Change]:
        out: list[Change] = []
        while self.planned(role) < want:
            back = self.role(role, DRAINING)  # cheapest first: it is still loaded
            slot = back[0] if back else next(iter(self.role(role, OFF)), None)
            if slot is None:
                break
            if slot.state == DRAINING:
                self._set(slot, ACTIVE, now)
            else:
                slot.ready_at = now + startup_s(slot)
                self._set(slot, STARTING, now)
            out.append(Change(slot, slot.state))
        while self.planned(role) > want:
            starting = self.role(role, STARTING)
            if starting:  # never served: it stops loading
                slot = max(starting, key=lambda s: s.ready_at)
                self._set(slot, OFF, now)
            else:
                slot = min(self.role(role, ACTIVE), key=drain_order)
                self._set(slot, DRAINING, now)
            out.append(Change(slot, slot.state))
        return out

    def ready(self, slot: InstanceSlot, now: float) -> bool:
        """A starting slot's start-up is over at `now`: active (False when it was stopped meanwhile)."""
        if slot.state != STARTING or slot.ready_at > now:
            return False
        self._set(slot, ACTIVE, now)
        return True

    def drained(self, slot: InstanceSlot, now: float) -> None:
        """A draining slot has nothing left: its GPUs are free."""
        assert slot.state == DRAINING
        self._set(slot, OFF, now)

    def _set(self, slot: InstanceSlot, state: str, now: float) -> None:
        slot.state = state
        gpus = self.held_gpus()
        if self.held[-1][0] == now:
            self.held[-1] = (now, gpus)
        elif self.held[-1][1] != gpus:
            self.held.append((now, gpus))


def gpu_seconds(held: list[tuple[float, int]], start: float, end: float) -> float:
    """GPU-seconds of the step function `held` ((from t, GPUs) in time order) over [start, end]."""
    total = 0.0
    for i, (t, gpus) in enumerate(held):
        t_next = held[i + 1][0] if i + 1 < len(held) else end
        lo, hi = max(t, start), min(t_next, end)
        if hi > lo:
            total += gpus * (hi - lo)
    return total
