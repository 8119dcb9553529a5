"""Chained 64-bit block hashes: the only identity of a KV block (pool key, router key, event payload).

Specification (every component computes the same ids):
- Only *full* blocks of `block_size` tokens are hashed.
- root = XXH3-64(model_id as UTF-8, seed 0).
- hash(block i) = XXH3-64(parent.to_bytes(8, "little") + tokens as little-endian uint32, seed 0),
  where parent is the root for block 0 and hash(block i-1) otherwise.
So equal prefixes give equal ids, a different token changes its block and every later one, and the
model id keeps KV of different models apart.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xxhash

_U32_LE = np.dtype("<u4")


def root_hash(model_id: str) -> int:
    """The parent hash of a sequence's first block."""
    return xxhash.xxh3_64_intdigest(model_id.encode("utf-8"))


def hash_block(parent: int, tokens: Sequence[int] | np.ndarray) -> int:
    """Hash of one block given its parent's hash."""
    body = np.asarray(tokens, dtype=_U32_LE).tobytes()
    return xxhash.xxh3_64_intdigest(parent.to_bytes(8, "little") + body)


def block_hashes(
    tokens: Sequence[int] | np.ndarray,
    block_size: int,
    model_id: str,
    parent: int | None = None,
) -> list[int]:
    """Chained hashes of every full block of `tokens` (a trailing partial block is not hashed).

    `parent` continues a chain (e.g. to extend a request's hashes incrementally); default is the root.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    arr = np.asarray(tokens, dtype=_U32_LE)
    prev = root_hash(model_id) if parent is None else parent
    out: list[int] = []
    for start in range(0, len(arr) - block_size + 1, block_size):
        prev = xxhash.xxh3_64_intdigest(prev.to_bytes(8, "little") + arr[start : start + block_size].tobytes())
        out.append(prev)
    return out
