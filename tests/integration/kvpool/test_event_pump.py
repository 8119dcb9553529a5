"""A rank's KV events go out on the pump's thread, in order, on a real Redis: the caller never
waits for Redis (not even while it is down), and after an outage the stream gets a new epoch that
starts with `cleared`, so the router forgets the rank's blocks instead of trusting a view with
holes."""

from __future__ import annotations

import time

import pytest
import redis

from rackserve.kv.events import KVEvent, Publisher
from services import event_pump, kvevents
from services.event_pump import EventPump

pytestmark = pytest.mark.integration
RANK = Publisher("prefill-dep2-0", 1)


def stored(*hashes: int) -> KVEvent:
    return KVEvent("stored", RANK, 1, "rank_hbm", tuple(hashes))  # the pump numbers it


def test_events_are_published_in_order_with_one_numbering(private_redis) -> None:
    client = redis.Redis.from_url(private_redis.url)
    pump = EventPump(client, RANK)
    for h in range(1, 6):
        pump.send([stored(h)])
    pump.flush()
    events = [e for _, e in kvevents.read(client)]
    assert [e.block_hashes for e in events] == [(h,) for h in range(1, 6)]
    assert [e.seq for e in events] == [1, 2, 3, 4, 5] and len({e.epoch for e in events}) == 1


def test_a_redis_outage_never_blocks_the_step_and_ends_in_a_new_epoch(
    private_redis, monkeypatch
) -> None:
    monkeypatch.setattr(event_pump, "REDIS_RETRY_S", 0.05)
    client = redis.Redis.from_url(private_redis.url, socket_timeout=1.0, socket_connect_timeout=1.0)
    pump = EventPump(client, RANK)
    pump.send([stored(1)])
    pump.flush()
    private_redis.kill()
    started = time.perf_counter()
    pump.send([stored(2)])  # lost: Redis is down
    assert time.perf_counter() - started < 0.05  # the step handed it over and went on
    pump.flush()
    private_redis.revive()
    time.sleep(0.1)  # past the retry delay
    pump.send([stored(3)])
    pump.flush()
    events = [e for _, e in kvevents.read(client)]  # the revived Redis is empty
    assert [(e.kind, e.seq, e.block_hashes) for e in events] == [
        ("cleared", 1, ()),
        ("stored", 2, (3,)),
    ]
