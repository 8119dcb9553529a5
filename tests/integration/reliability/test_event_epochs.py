"""KV events through a real Redis Stream with publisher epochs: a restarted publisher (new epoch,
numbers from 1) is read as a restart, not a gap, and the router's index follows it; a late event
of the old epoch is left out. Replaying the whole stream into a fresh index gives the same index
(what a restarted router does)."""

from __future__ import annotations

import pytest
import redis

from rackserve.kv.block_hash import block_hashes
from rackserve.kv.events import EventSequencer, Publisher
from rackserve.routing import PrefixIndex
from services import kvevents
from services.redis_server import RedisServer

pytestmark = pytest.mark.integration
BS = 16
CHAIN = block_hashes(list(range(900, 900 + 6 * BS)), BS, "m")
RANK = Publisher("decode-wide-ep-0", 1)


@pytest.fixture(scope="module")
def client():
    with RedisServer() as server:
        c = redis.Redis.from_url(server.url)
        yield c
        c.close()


def test_a_restarted_publisher_is_followed_through_the_stream(client):
    first, again = EventSequencer(RANK, epoch=10), EventSequencer(RANK, epoch=20)
    kvevents.publish(client, [first.make("stored", "rank_hbm", tuple(CHAIN[:4]))])
    kvevents.publish(client, [first.make("removed", "rank_hbm", (CHAIN[3],))])
    kvevents.publish(client, [again.make("cleared", "rank_hbm"),
                              again.make("stored", "rank_hbm", tuple(CHAIN[:2]))])
    kvevents.publish(client, [first.make("stored", "rank_hbm", tuple(CHAIN[:6]))])  # late, old
    reader, idx = kvevents.KVEventReader(client), PrefixIndex()
    events = reader.read_batch()
    assert reader.gaps == []
    assert [(e.epoch, e.seq) for e in events] == [(10, 1), (10, 2), (20, 1), (20, 2)]
    idx.apply_all(events)
    hit = idx.match(CHAIN, BS, len(CHAIN) * BS + 1).hit((RANK.instance, RANK.dp_rank))
    assert hit.rank_hbm == 2 * BS and not idx.is_stale(RANK)
    replayed = PrefixIndex()
    replayed.apply_all(e for _, e in kvevents.read(client))  # everything, the late one included
    assert replayed.snapshot() == idx.snapshot()
