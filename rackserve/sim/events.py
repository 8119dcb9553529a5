"""Simulator events and the event queue. The heap key (time, priority, sequence) is built in ONE place.

Each event handles itself against the simulator and returns the events it causes (Vidur style).
At equal times, lower priority runs first: step ends free capacity before new work lands, KV
hand-offs join decode batches before new arrivals are routed, and an idle prefill instance
starts its step only after all arrivals of that instant; equal (time, priority) run in push
order (the sequence number).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import ClassVar, Protocol

from rackserve.workload.request import Request


class Handlers(Protocol):
    """What events call on the simulator (rackserve.sim.simulator.Simulator implements it), so this
    module needs no import of the simulator: the dependency points one way."""

    def on_arrival(self, now: float, request: Request) -> list[Event]: ...
    def on_prefill_kick(self, now: float, instance: int) -> list[Event]: ...
    def on_prefill_step_end(self, now: float, instance: int) -> list[Event]: ...
    def on_kv_arrive(self, now: float, record: object) -> list[Event]: ...
    def on_decode_leap_end(self, now: float, instance: int, version: int) -> list[Event]: ...
    def on_planner_tick(self, now: float) -> list[Event]: ...
    def on_instance_ready(self, now: float, slot: object) -> list[Event]: ...


class Event:
    priority: ClassVar[int]
    time: float

    def handle(self, sim: Handlers) -> list[Event]:
        raise NotImplementedError


@dataclass(eq=False)
class PrefillStepEnd(Event):
    priority: ClassVar[int] = 0
    time: float
    instance: int

    def handle(self, sim: Handlers) -> list[Event]:
        return sim.on_prefill_step_end(self.time, self.instance)


@dataclass(eq=False)
class DecodeLeapEnd(Event):
    priority: ClassVar[int] = 1
    time: float
    instance: int
    version: int

    def handle(self, sim: Handlers) -> list[Event]:
        return sim.on_decode_leap_end(self.time, self.instance, self.version)


@dataclass(eq=False)
class KVArrive(Event):
    """A prompt's KV reached its decode rank (P/D transfer done)."""

    priority: ClassVar[int] = 2
    time: float
    record: object  # the simulator's in-flight record

    def handle(self, sim: Handlers) -> list[Event]:
        return sim.on_kv_arrive(self.time, self.record)


@dataclass(eq=False)
class Arrival(Event):
    priority: ClassVar[int] = 3
    time: float
    request: Request

    def handle(self, sim: Handlers) -> list[Event]:
        return sim.on_arrival(self.time, self.request)


@dataclass(eq=False)
class PrefillKick(Event):
    """An idle prefill instance got work: it starts a step after every arrival of this instant is
    admitted, so requests arriving together share the step (as a real engine's next tick would)."""

    priority: ClassVar[int] = 4
    time: float
    instance: int

    def handle(self, sim: Handlers) -> list[Event]:
        return sim.on_prefill_kick(self.time, self.instance)


@dataclass(eq=False)
class InstanceReady(Event):
    """A planned instance's start-up (weights load, warm-up) is over: it becomes routable. Before
    arrivals of the same instant, so they may go to it (rackserve/sim/planned.py)."""

    priority: ClassVar[int] = 2
    time: float
    slot: object  # rackserve.planner.InstanceSlot

    def handle(self, sim: Handlers) -> list[Event]:
        return sim.on_instance_ready(self.time, self.slot)


@dataclass(eq=False)
class PlannerTick(Event):
    """The planner reads the last tick's observations and decides (after everything else of the instant)."""

    priority: ClassVar[int] = 5
    time: float

    def handle(self, sim: Handlers) -> list[Event]:
        return sim.on_planner_tick(self.time)


def event_key(event: Event, seq: int) -> tuple[float, int, int]:
    """The one place the ordering key is built."""
    return (event.time, type(event).priority, seq)


class EventQueue:
    """A heap of events, plus the events known before the run (`preload`: a trace's arrivals) kept
    aside in key order and merged at `pop`, so the heap stays as small as the work in flight. The
    order is exactly that of pushing everything onto one heap."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Event]] = []
        self._pre: list[tuple[float, int, int, Event]] = []
        self._next = 0  # first preloaded entry not popped yet
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap) + len(self._pre) - self._next

    def push(self, event: Event) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (*event_key(event, self._seq), event))

    def preload(self, events: list[Event]) -> None:
        """Queue `events` (numbered in this order, as pushes would) on an empty queue."""
        assert not self, "preload an empty queue"
        entries = []
        for event in events:
            self._seq += 1
            entries.append((*event_key(event, self._seq), event))
        entries.sort(key=lambda e: e[:3])  # (time, priority, seq): unique, events never compared
        self._pre, self._next = entries, 0

    def pop(self) -> Event:
        event = self.pop_or_none()
        if event is None:
            raise IndexError("pop from an empty event queue")
        return event

    def pop_or_none(self) -> Event | None:
        """The next event, None when the queue is empty (the run loop's test and pop in one)."""
        heap, pre, i = self._heap, self._pre, self._next
        if i < len(pre) and (not heap or pre[i] < heap[0]):  # seqs differ: events never compared
            self._next = i + 1
            return pre[i][-1]
        return heapq.heappop(heap)[-1] if heap else None
