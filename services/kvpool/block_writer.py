"""Writing KV blocks to Redis without copying them: MSET commands whose RESP headers are small
buffers beside the blocks' own bytes, sent on a pooled redis-py connection, one reply each.

Why not `redis.pipeline()` of SETs: it packs every command into a new buffer (hiredis
`pack_command` copies the 56 KiB value) and parses a reply per block through the command machinery;
for a batch of 128 x 56 KiB blocks that is ~3x the client CPU of this path (bench/pool/transfer_vs_redis.py:
raw_set vs raw_set_packed).
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

MAX_COMMAND_BYTES = 256 * 1024**2  # well below Redis's 1 GiB client-query-buffer-limit


def packed_msets(keys: Sequence[bytes], values: Sequence[bytes],
                 max_command_bytes: int = MAX_COMMAND_BYTES) -> tuple[list[bytes], int]:
    """RESP of `MSET k v ...` commands covering every pair (each at most `max_command_bytes` of
    values, one pair at least), as buffers to send in order, and how many commands. The values are
    not copied."""
    out: list[bytes] = []
    commands = 0
    start = 0
    while start < len(keys):
        end, size = start, 0
        while end < len(keys) and (end == start or size + len(values[end]) <= max_command_bytes):
            size += len(values[end])
            end += 1
        sep = b"*%d\r\n$4\r\nMSET\r\n" % (2 * (end - start) + 1)
        for key, value in zip(keys[start:end], values[start:end], strict=True):
            out.append(b"%s$%d\r\n%s\r\n$%d\r\n" % (sep, len(key), key, len(value)))
            out.append(value)
            sep = b"\r\n"
        out.append(b"\r\n")
        commands += 1
        start = end
    return out, commands


def set_blocks(client: redis.Redis, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
    """Set every key to its value in one round trip (retried by the connection's retry policy on a
    dropped connection: MSET is idempotent). Raises redis.RedisError (e.g. OOM)."""
    if len(keys) != len(values):
        raise ValueError(f"keys and values differ in length: {len(keys)} != {len(values)}")
    if not keys:
        return
    buffers, commands = packed_msets(keys, values)
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        conn.retry.call_with_retry(lambda: _send(conn, buffers, commands), lambda _: conn.disconnect())
    finally:
        pool.release(conn)


def _send(conn: redis.connection.Connection, buffers: list[bytes], replies: int) -> None:
    try:
        conn.send_packed_command(buffers)
        for _ in range(replies):
            conn.read_response()  # raises ResponseError on an error reply
    except BaseException:
        conn.disconnect()  # replies may be left unread: this connection cannot be reused as is
        raise
