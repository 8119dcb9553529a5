import pytest

from rackserve.sim.events import (
    Arrival,
    DecodeLeapEnd,
    EventQueue,
    KVArrive,
    PrefillKick,
    PrefillStepEnd,
    event_key,
)
from rackserve.workload.request import Request


def test_tie_break_order_is_pinned():
    q = EventQueue()
    req = Request(0, 1.0, 10, 1, ())
    later = Arrival(2.0, req)
    arrival_a, arrival_b = Arrival(1.0, req), Arrival(1.0, req)
    kv = KVArrive(1.0, None)
    leap = DecodeLeapEnd(1.0, 0, 1)
    step = PrefillStepEnd(1.0, 0)
    kick = PrefillKick(1.0, 0)
    for ev in (later, kick, arrival_a, kv, arrival_b, leap, step):
        q.push(ev)
    order = [q.pop() for _ in range(len(q))]
    # same time: prefill step ends, decode leap ends, KV hand-offs, arrivals (FIFO), prefill kicks
    assert order == [step, leap, kv, arrival_a, arrival_b, kick, later]


def test_key_carries_a_real_priority():
    keys = [event_key(e, 7) for e in (PrefillStepEnd(0.5, 0), DecodeLeapEnd(0.5, 0, 0),
                                      KVArrive(0.5, None), Arrival(0.5, Request(0, 0.5, 1, 1, ())),
                                      PrefillKick(0.5, 0))]
    assert [k[1] for k in keys] == [0, 1, 2, 3, 4]
    assert all(isinstance(k[1], int) and k[0] == 0.5 and k[2] == 7 for k in keys)


def test_pop_or_none_drains_preloaded_and_pushed_events_in_order_then_answers_none():
    req = Request(0, 1.0, 10, 1, ())
    q = EventQueue()
    first, third = Arrival(1.0, req), Arrival(3.0, req)
    q.preload([third, first])  # a trace's arrivals, kept aside from the heap
    second, fourth = PrefillStepEnd(2.0, 0), PrefillKick(4.0, 0)
    q.push(fourth)
    q.push(second)
    assert [q.pop_or_none() for _ in range(5)] == [first, second, third, fourth, None]
    assert not q and q.pop_or_none() is None
    with pytest.raises(IndexError, match="empty"):
        q.pop()
