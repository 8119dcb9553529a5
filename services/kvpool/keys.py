"""Where the pool keeps things in Redis: one key per block (its chained hash in hex) and an epoch key."""

from __future__ import annotations

DEFAULT_PREFIX = "rackserve:kv:"
_HEX_GLOB = "?" * 16


def block_key(prefix: str, block_hash: int) -> str:
    """`<prefix><16 lowercase hex digits>`: the bytes of one KV block."""
    return f"{prefix}{block_hash:016x}"


def block_keys(prefix: str, block_hashes: list[int]) -> list[bytes]:
    """`block_key` of each hash, as the bytes sent to Redis."""
    head = prefix.encode()
    return [b"%s%016x" % (head, h) for h in block_hashes]


def block_glob(prefix: str) -> str:
    """A SCAN pattern that matches every block key under `prefix` and nothing else of the pool."""
    return prefix.replace("[", "\\[").replace("*", "\\*").replace("?", "\\?") + _HEX_GLOB


def epoch_key(prefix: str) -> str:
    """Holds the running pool's token; gone after Redis restarts empty."""
    return f"{prefix}@epoch"
