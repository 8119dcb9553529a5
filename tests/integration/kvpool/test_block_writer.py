"""The pool client's zero-copy block writer on a real Redis: byte-exact, split into commands by
size, and an error reply (OOM) raises without leaving the pooled connection out of step."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import redis

from services.kvpool.block_writer import packed_msets, set_blocks

pytestmark = pytest.mark.integration


def blocks(n: int, size: int, seed: int = 0) -> tuple[list[bytes], list[bytes]]:
    rng = np.random.default_rng(seed)
    tag = uuid.uuid4().hex[:8]
    return [f"test:{tag}:{i:04d}".encode() for i in range(n)], [rng.bytes(size) for _ in range(n)]


def test_blocks_round_trip_byte_exact(redis_client) -> None:
    keys, values = blocks(64, 57344)
    values[3] = b"\r\n$5\r\n" * 10  # RESP framing inside a value is only bytes
    set_blocks(redis_client, keys, values)
    assert redis_client.mget(keys) == values
    redis_client.unlink(*keys)


def test_large_batches_are_split_into_commands_by_value_bytes(redis_client) -> None:
    keys, values = blocks(10, 1000)
    buffers, commands = packed_msets(keys, values, max_command_bytes=3500)
    assert commands == 4  # 3 + 3 + 3 + 1 values of 1,000 bytes
    assert sum(any(b is v for v in values) for b in buffers) == 10  # the values are not copied
    conn = redis_client.connection_pool.get_connection()
    try:
        conn.send_packed_command(buffers)
        assert [conn.read_response() for _ in range(commands)] == [b"OK"] * commands
    finally:
        redis_client.connection_pool.release(conn)
    assert redis_client.mget(keys) == values
    redis_client.unlink(*keys)


def test_an_error_reply_raises_and_the_connection_stays_usable(private_redis) -> None:
    client = redis.Redis.from_url(private_redis.url)
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 2 * 1024**2)
    keys, values = blocks(64, 57344)  # 3.5 MiB > 2 MiB
    with pytest.raises(redis.ResponseError, match="maxmemory"):
        set_blocks(client, keys, values)
        set_blocks(client, keys, values)  # the first may fit before Redis counts it
    client.config_set("maxmemory", 0)
    assert client.ping()  # the pool's connection answers this command, not a stale reply
    set_blocks(client, keys[:4], values[:4])
    assert client.mget(keys[:4]) == values[:4]
    client.close()


def test_mismatched_lengths_are_a_value_error(redis_client) -> None:
    with pytest.raises(ValueError, match="differ in length"):
        set_blocks(redis_client, [b"a", b"b"], [b"1"])
