"""Pool fixtures: a real gRPC pool server (in this process) on the session's real Redis.

Each test gets its own key prefix and event stream, so tests sharing the Redis never collide.
"""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from rackserve.kv.pool_tiers import PoolLimits
from services.kvpool.client import PoolClient
from services.kvpool.server import PoolOptions, PoolServer

BIG = 1 << 40


@pytest.fixture
def make_pool(redis_server):
    """make_pool(limits=None, redis_url=None, clock=time.monotonic) -> (server, client); the pool's
    time comes from `clock` (a test may step it). Stopped after the test."""
    started = []

    def make(limits: PoolLimits | None = None, redis_url: str | None = None, clock=time.monotonic,
             **options):
        tag = uuid.uuid4().hex[:8]
        opts = PoolOptions(redis_url or redis_server, key_prefix=f"test:{tag}:kv:",
                           event_stream=f"test:{tag}:events", epoch_check_s=0.05, **options)
        server = PoolServer(limits or PoolLimits(BIG, BIG, BIG), opts, clock=clock).start()
        client = PoolClient(server.address, owner=f"writer-{tag}", timeout_s=5.0)
        started.append((server, client))
        return server, client

    yield make
    for server, client in started:
        client.close()
        server.stop(0)


@pytest.fixture
def redis_client(redis_server):
    client = redis.Redis.from_url(redis_server)
    yield client
    client.close()
