"""The pool at its edges: Redis restarting empty, malformed requests, the process entry point."""

from __future__ import annotations

import time
import urllib.request
import uuid

import grpc
import numpy as np
import pytest
import redis

from rackserve.kv.pool_tiers import PoolLimits
from services import kvevents
from services._proto import kvpool_pb2 as pb
from services._proto import kvpool_pb2_grpc as pb_grpc
from services.kvpool.client import PoolClient
from services.kvpool.keys import block_key
from services.kvpool.server import PoolOptions, PoolServer
from services.kvpool.spawn import PoolProcess

pytestmark = pytest.mark.integration


def wait_for(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_redis_restarting_empty_gives_misses_and_cleared(make_pool, private_redis):
    server, client = make_pool(redis_url=private_redis.url)
    hashes = list(range(1, 9))
    values = [np.random.default_rng(i).bytes(4096) for i in hashes]
    assert client.put(hashes, values).ok
    private_redis.kill()
    assert client.get(hashes).hits == 0  # Redis down: misses, no exception
    assert not client.put([100], [b"v"]).ok  # and a clean put failure
    private_redis.start()  # same port, empty
    wait_for(lambda: client.stats().epoch == 2)
    server.store.flush()
    assert client.match_prefix(hashes).count == 0 and client.get(hashes).hits == 0
    assert client.stats().tiers[0].keys == 0
    fresh = redis.Redis.from_url(private_redis.url)
    events = [e for _, e in kvevents.read(fresh, stream=server.store.stream)]
    assert [(e.kind, e.tier) for e in events[:2]] == [("cleared", "pool_hbm"), ("cleared", "pool_dram")]
    assert events[0].seq > 2  # numbering continues: the router sees a gap, then `cleared`
    assert client.put(hashes, values).ok  # serving again
    assert client.get(hashes).values == tuple(values)
    fresh.close()


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"block_hashes": [1, 1], "sizes": [10, 10]}, "block_hashes[1] repeats block_hashes[0]"),
        ({"block_hashes": [1], "sizes": [0]}, "sizes[0]"),
        ({"block_hashes": [1, 2], "sizes": [10]}, "sizes (1)"),
        ({"block_hashes": [1], "sizes": [10], "target_sizes": [1, 2]}, "target_sizes (2"),
        ({"block_hashes": [1], "sizes": [10], "owner": ""}, "owner"),
        ({"block_hashes": list(range(101)), "sizes": [10] * 101}, "block_hashes: 101 entries"),
    ],
)
def test_malformed_puts_are_invalid_argument(make_pool, request_fields, field):
    _, client = make_pool(max_blocks_per_request=100)
    stub = pb_grpc.KVPoolStub(client._channel)
    with pytest.raises(grpc.RpcError) as err:
        stub.BatchPutReserve(pb.ReserveRequest(**{"owner": "w", **request_fields}))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details()


@pytest.mark.parametrize(
    ("written", "field"),
    [
        (lambda hashes: [hashes[0], hashes[1], hashes[0]], "written[2] repeats written[0]"),
        (lambda hashes: [], "written: empty"),
    ],
)
def test_malformed_commits_are_invalid_argument_and_commit_nothing(make_pool, written, field):
    """A repeated hash used to raise KeyError in the server; an empty list committed every
    reserved block, written or not. Both are refused whole: nothing becomes visible."""
    _, client = make_pool()
    stub = pb_grpc.KVPoolStub(client._channel)
    hashes = [11, 12, 13]
    reply = stub.BatchPutReserve(pb.ReserveRequest(owner="w", block_hashes=hashes, sizes=[10] * 3))
    with pytest.raises(grpc.RpcError) as err:
        stub.BatchPutCommit(pb.CommitRequest(txn=reply.txn, written=written(hashes)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details()
    assert client.match_prefix(hashes).count == 0  # nothing committed
    done = stub.BatchPutCommit(pb.CommitRequest(txn=reply.txn, written=hashes))
    assert list(done.committed) == hashes  # the reservation is intact: a good commit still works


def test_oversized_reads_are_invalid_argument_and_client_raises_valueerror(make_pool):
    _, client = make_pool(max_blocks_per_request=100)
    with pytest.raises(ValueError, match="block_hashes: 101 entries"):
        client.get(list(range(101)))
    with pytest.raises(ValueError, match="block_hashes: 500 entries"):
        client.match_prefix(list(range(500)))
    assert client.get(list(range(100))).hits == 0  # at the limit is fine


def test_entry_point_serves_grpc_and_metrics(redis_server):
    tag = uuid.uuid4().hex[:8]
    pool = PoolProcess(redis_server, ("--key-prefix", f"test:{tag}:kv:", "--event-stream", f"test:{tag}:ev"))
    with pool:
        with PoolClient(pool.address, owner="entry") as client:
            assert client.put([7, 8], [b"a" * 100, b"b" * 50]).ok
            assert client.get([7, 8]).values == (b"a" * 100, b"b" * 50)
            assert client.health().serving
        text = urllib.request.urlopen(f"http://{pool.metrics_address}/metrics", timeout=5).read().decode()
        assert 'rackserve_pool_blocks{tier="pool_hbm"} 2.0' in text.splitlines()
        assert pool.stop() == 0  # SIGTERM: a clean exit


def test_restarted_pool_drops_leftovers_and_announces_cleared(redis_server, redis_client):
    tag = uuid.uuid4().hex[:8]
    opts = PoolOptions(redis_server, key_prefix=f"test:{tag}:kv:", event_stream=f"test:{tag}:ev")
    first = PoolServer(PoolLimits(1 << 30, 1 << 30, 1 << 30), opts).start()
    with PoolClient(first.address) as client:
        assert client.put([1, 2, 3], [b"a", b"b", b"c"]).ok
    first.stop(0)
    assert redis_client.exists(*(block_key(opts.key_prefix, h) for h in (1, 2, 3))) == 3
    second = PoolServer(PoolLimits(1 << 30, 1 << 30, 1 << 30), opts).start()
    try:
        second.store.flush()
        assert redis_client.exists(*(block_key(opts.key_prefix, h) for h in (1, 2, 3))) == 0
        reader = kvevents.KVEventReader(redis_client, stream=opts.event_stream)
        events = reader.read_batch()
        restart = [(e.kind, e.seq) for e in events][-2:]
        assert restart == [("cleared", 1), ("cleared", 2)] and not reader.gaps  # seq 1 again = restart
    finally:
        second.stop(0)
