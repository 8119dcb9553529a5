"""Deterministic token synthesis from content ids, and incremental hash chains over them.

A content id (a Mooncake hash id, a session's tool output, ...) always yields the same tokens, so
equal ids give equal KV blocks. Tokens are generated on the fly and never kept beyond one block.
"""

from __future__ import annotations

import numpy as np
import xxhash

from rackserve.kv.block_hash import block_hashes, root_hash

DEFAULT_VOCAB = 129_280  # DeepSeek-V4.1-Flash vocab (REFERENCE.md)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)  # splitmix64 finalizer constants (Steele et al. 2014)
_MIX2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def content_id(*parts: object) -> int:
    """A stable 64-bit id for a named piece of content, e.g. content_id("tool-output", seed, s, t)."""
    return xxhash.xxh3_64_intdigest("/".join(str(p) for p in parts).encode())


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over a uint64 array, in place (a bijection: distinct in, distinct out).
    Array integer arithmetic wraps silently in numpy (only scalar ops warn), so no errstate."""
    x ^= x >> np.uint64(30)
    x *= _MIX1
    x ^= x >> np.uint64(27)
    x *= _MIX2
    x ^= x >> np.uint64(31)
    return x


def synth_tokens(cid: int, start: int, count: int, vocab: int = DEFAULT_VOCAB) -> np.ndarray:
    """Tokens [start, start+count) of content `cid` (splitmix64 of id and position, mod vocab)."""
    with np.errstate(over="ignore"):
        x = np.arange(start, start + count, dtype=np.uint64) * _GOLDEN + np.uint64(cid)
    return (mix64(x) % np.uint64(vocab)).astype(np.uint32)


def synth_token_rows(cids: np.ndarray, count: int, vocab: int = DEFAULT_VOCAB) -> np.ndarray:
    """synth_tokens(cid, 0, count) of each content id, one row per id, in one array pass."""
    with np.errstate(over="ignore"):
        x = np.arange(count, dtype=np.uint64)[None, :] * _GOLDEN + cids.astype(np.uint64)[:, None]
    return (mix64(x) % np.uint64(vocab)).astype(np.uint32)


class HashChain:
    """A growing token sequence represented by its full blocks' chained hashes plus a partial tail."""

    def __init__(self, block_size: int, model_id: str) -> None:
        self.block_size = block_size
        self.model_id = model_id
        self.hashes: list[int] = []
        self.length = 0
        self._tail = np.zeros(0, dtype=np.uint32)

    def extend(self, tokens: np.ndarray) -> None:
        """Append tokens; every block they complete is hashed and chained."""
        data = np.concatenate([self._tail, tokens.astype(np.uint32, copy=False)])
        parent = self.hashes[-1] if self.hashes else root_hash(self.model_id)
        self.hashes.extend(block_hashes(data, self.block_size, self.model_id, parent=parent))
        full = (len(data) // self.block_size) * self.block_size
        self._tail = data[full:]
        self.length += len(tokens)

    def extend_content(self, cid: int, count: int) -> None:
        """Append `count` tokens of content `cid` (from its start)."""
        self.extend(synth_tokens(cid, 0, count))

    def fork(self) -> HashChain:
        """An independent copy sharing this prefix (a subagent continuing its parent's context)."""
        other = HashChain(self.block_size, self.model_id)
        other.hashes = list(self.hashes)
        other.length = self.length
        other._tail = self._tail.copy()
        return other
