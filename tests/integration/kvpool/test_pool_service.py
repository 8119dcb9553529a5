"""The KV pool service end to end: real gRPC server, real Redis, bytes moved by PoolClient."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from rackserve.kv.block_hash import block_hashes
from rackserve.kv.kv_codec import decode_block, encode_block
from rackserve.kv.pool_tiers import PoolLimits
from services import kvevents
from services._proto import kvpool_pb2 as pb
from services._proto import kvpool_pb2_grpc as pb_grpc
from services.kvpool.keys import block_key

pytestmark = pytest.mark.integration
BLOCK = 1000


def chain(n: int, seed: int = 0) -> list[int]:
    tokens = np.random.default_rng(seed).integers(0, 50000, size=16 * n)
    return block_hashes(tokens, 16, "test-model")


def payloads(n: int, size: int = BLOCK, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.bytes(size) for _ in range(n)]


def small_limits(hbm_blocks: int, dram_blocks: int, lease_s: float = 30.0) -> PoolLimits:
    return PoolLimits(hbm_blocks * BLOCK, dram_blocks * BLOCK, 1 << 40, 0.9, 0.5, lease_s)


def test_put_get_round_trip_is_byte_exact(make_pool):
    _, client = make_pool()
    hashes = chain(8)
    rng = np.random.default_rng(1)
    k, v = rng.standard_normal((2, 4, 16, 32), dtype=np.float32)
    values = payloads(7, seed=2) + [encode_block(k, v, fingerprint=1234)]  # random + real codec output
    values[3] = b"\x00" * 5 + b"\xff" * 70000  # odd sizes too
    put = client.put(hashes, values)
    assert put.ok and put.written == tuple(hashes)
    got = client.get(hashes + [12345])
    assert got.values[:8] == tuple(values) and got.values[8] is None
    assert got.tiers == ("pool_hbm",) * 8 + (None,)
    k2, v2 = decode_block(got.values[7], (4, 16, 32), 1234)
    assert np.array_equal(k, k2) and np.array_equal(v, v2)
    again = client.put(hashes, values)
    assert again.written == () and again.stored == tuple(hashes)


def test_two_phase_put_is_invisible_until_commit(make_pool, redis_client):
    server, client = make_pool()
    stub = pb_grpc.KVPoolStub(client._channel)
    hashes = chain(3)
    reply = stub.BatchPutReserve(pb.ReserveRequest(owner="w", block_hashes=hashes, sizes=[10] * 3))
    assert list(reply.statuses) == [pb.PUT_RESERVED] * 3
    for h in hashes:
        redis_client.set(block_key(client.key_prefix, h), b"0123456789")
    assert client.match_prefix(hashes).count == 0
    assert client.get(hashes).hits == 0
    pending = client.put(hashes, [b"x" * 10] * 3)  # another writer holds them: not readable yet
    assert pending.written == () and pending.stored == () and pending.pending == tuple(hashes)
    stub.BatchPutCommit(pb.CommitRequest(txn=reply.txn, written=hashes))
    assert client.match_prefix(hashes).count == 3
    assert client.get(hashes).values == (b"0123456789",) * 3


def test_match_prefix_spans_tiers(make_pool):
    _, client = make_pool(small_limits(hbm_blocks=10, dram_blocks=100))
    hashes = chain(12)
    for i, h in enumerate(hashes):  # one at a time; a put refreshes the chain before it
        assert client.put([h], payloads(1, seed=i), parent_hash=hashes[i - 1] if i else None).ok
    match = client.match_prefix(hashes + chain(2, seed=9))
    assert match.count == 12
    # tails are demoted before their parents: the chain's head stays in the faster tier
    assert match.tiers[0] == "pool_hbm" and match.tiers[-1] == "pool_dram"
    n_hbm = match.tiers.count("pool_hbm")
    assert match.tiers == ("pool_hbm",) * n_hbm + ("pool_dram",) * (12 - n_hbm)
    assert client.match_prefix([hashes[0], 777, hashes[2]]).count == 1


def test_watermark_eviction_is_lru_demotes_then_drops(make_pool, redis_client):
    server, client = make_pool(small_limits(hbm_blocks=10, dram_blocks=10))
    hashes = chain(9)
    for h, v in zip(hashes, payloads(9), strict=True):
        client.put([h], [v])
    client.get([hashes[0]])  # refresh the oldest
    client.put([555], payloads(1, seed=5))  # over 90%: hbm evicts LRU down to 50%
    tiers = {h: client.match_prefix([h]).tiers[0] for h in hashes}
    assert [h for h in hashes if tiers[h] == "pool_dram"] == hashes[1:6]
    assert tiers[hashes[0]] == "pool_hbm"
    stats = client.stats()
    assert stats.demotions == 5 and stats.tiers[0].evictions == 5 and stats.tiers[0].keys == 5
    for i in range(30):  # push everything through dram: dropped blocks lose their Redis key
        client.put([1000 + i], payloads(1, seed=100 + i))
    gone = [h for h in hashes if client.match_prefix([h]).count == 0]
    server.store.flush()
    assert gone and all(not redis_client.exists(block_key(client.key_prefix, h)) for h in gone)
    assert client.stats().tiers[1].evictions > 0
    for i in range(30):  # a dropped block put again right away keeps its new bytes
        h = 5000 + i
        assert client.put([h], [b"new"]).ok
        client.put([6000 + i], [b"x" * BLOCK])  # evicts h soon after...
        client.remove([h])  # ...or drop it now, then store it again at once
        assert client.put([h], [b"again"]).ok and client.get([h]).values == (b"again",)


class SteppedClock:
    """The pool's clock, moved by the test: a lease expires exactly when the test says."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_lease_blocks_eviction_until_it_expires(make_pool):
    clock = SteppedClock()
    _, client = make_pool(small_limits(hbm_blocks=2, dram_blocks=0, lease_s=2.0), clock=clock)
    stub = pb_grpc.KVPoolStub(client._channel)
    client.put([1], payloads(1))
    lease = stub.BatchGet(pb.GetRequest(block_hashes=[1], lease=True))
    assert lease.lease_id != 0
    refused = client.put([2, 3], payloads(2, seed=1))
    assert refused.failed == (3,) and client.match_prefix([1]).count == 1
    assert client.stats().alloc_failures == 1
    clock.now_s = 1.999
    assert client.match_prefix([1]).count == 1 and client.stats().lease_expiries == 0  # still leased
    clock.now_s = 2.0  # the lease ends: block 1 may now be evicted
    assert client.put([3], payloads(1, seed=3)).ok
    assert client.match_prefix([1]).count == 0
    assert client.stats().lease_expiries == 1
    assert not stub.ReleaseLease(pb.ReleaseRequest(lease_id=lease.lease_id)).released


def test_put_without_space_fails_cleanly(make_pool):
    _, client = make_pool(small_limits(hbm_blocks=1, dram_blocks=1))
    result = client.put([1], [b"z" * (3 * BLOCK)])
    assert not result.ok and result.failed == (1,) and result.written == ()
    assert client.get([1]).hits == 0


def test_events_are_sequenced_and_replayable(make_pool, redis_client):
    server, client = make_pool(small_limits(hbm_blocks=4, dram_blocks=100))
    hashes = chain(6)
    client.put(hashes[:3], payloads(3))
    client.put(hashes[3:], payloads(3, seed=1), parent_hash=hashes[2])
    client.remove([hashes[5]])
    server.store.flush()
    reader = kvevents.KVEventReader(redis_client, stream=server.store.stream)
    events = reader.read_batch()
    assert [e.seq for e in events] == list(range(1, len(events) + 1)) and not reader.gaps
    assert [(e.kind, e.tier) for e in events[:2]] == [("cleared", "pool_hbm"), ("cleared", "pool_dram")]
    stored = [e for e in events if e.kind == "stored" and e.tier == "pool_hbm"]
    assert stored[0].block_hashes == tuple(hashes[:3]) and stored[0].parent_hash is None
    assert stored[1].block_hashes[0] == hashes[3] and stored[1].parent_hash == hashes[2]
    assert any(e.kind == "stored" and e.tier == "pool_dram" for e in events)  # demotions
    assert events[-1].kind == "removed" and events[-1].block_hashes == (hashes[5],)
    middle_id = kvevents.read(redis_client, stream=server.store.stream)[3][0]
    replay = kvevents.KVEventReader(redis_client, last_id=middle_id, stream=server.store.stream)
    assert replay.read_batch() == events[4:]
    assert replay.gaps and replay.gaps[0].expected_seq == 1  # joined mid-stream: reported, not trusted


def test_concurrent_writers_of_the_same_block_do_not_corrupt_it(make_pool):
    _, client = make_pool()
    hashes = chain(40)
    versions = [payloads(40, size=20000, seed=s) for s in range(4)]
    results = [None] * 4

    def writer(i: int) -> None:
        results[i] = client.put(hashes, versions[i])

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # a block another writer was still writing is pending for this one, not stored
    assert all(r.ok and set(r.stored) | set(r.pending) == set(hashes) for r in results)
    assert all(set(r.stored).isdisjoint(r.pending) for r in results)
    assert client.match_prefix(hashes).count == len(hashes)
    written = [h for r in results for h in r.written]
    assert sorted(written) == sorted(hashes)  # each block written by exactly one writer
    got = client.get(hashes).values
    for j, h in enumerate(hashes):
        owner = next(i for i, r in enumerate(results) if h in r.written)
        assert got[j] == versions[owner][j]


def test_metrics_endpoint_reports_tiers(make_pool):
    import urllib.request

    from services.kvpool.metrics import serve_metrics

    server, client = make_pool(small_limits(hbm_blocks=10, dram_blocks=10))
    client.put(chain(3), payloads(3))
    client.get(chain(3) + [42])
    http, port = serve_metrics(server.servicer, 0)
    try:
        scrape = lambda: set(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode().splitlines())  # noqa: E731
        lines = scrape()
        client.get(chain(3))
        later = scrape()
    finally:
        http.shutdown()
    assert 'rackserve_pool_hit_blocks_total{tier="pool_hbm"} 6.0' in later  # counters advance
    assert 'rackserve_pool_blocks{tier="pool_hbm"} 3.0' in lines
    assert 'rackserve_pool_used_bytes{tier="pool_hbm"} 3000.0' in lines
    assert 'rackserve_pool_redis_bytes{tier="pool_hbm"} 3000.0' in lines
    assert 'rackserve_pool_capacity_bytes{tier="pool_dram"} 10000.0' in lines
    assert 'rackserve_pool_hit_blocks_total{tier="pool_hbm"} 3.0' in lines
    assert "rackserve_pool_miss_blocks_total 1.0" in lines
    assert "rackserve_pool_puts_total 1.0" in lines
    assert "rackserve_pool_alloc_failures_total 0.0" in lines
