"""Importing KV blocks into a rank's cache (e.g. fetched from the pool, or a P->D hand-off).

Blocks come as [(block_hash, bytes)] in kv_codec format: chained hashes of a sequence's leading full
blocks. Every block is checked and decoded before the cache changes, so a bad one changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rackserve.kv.block_cache import BlockCache
from rackserve.kv.kv_codec import decode_block
from rackserve.kv.paged_kv import PagedKV
from rackserve.model.config import ModelConfig


def import_blocks(
    cfg: ModelConfig,
    cache: BlockCache,
    kv: PagedKV,
    hashes: list[int],
    blocks: list[list[int]],
    kv_blocks: Sequence[tuple[int, bytes]],
) -> tuple[list[int], int]:
    """Write the given blocks not cached yet; returns (every block of the given prefix found or
    written, each holding one extra reference the caller releases; how many were written)."""
    decoded = _decode(cfg, cache, hashes, blocks, kv_blocks)
    held: list[int] = []
    written = 0
    for i, pair in enumerate(decoded):
        present = cache.find(hashes[i], blocks[i])
        if present is not None:  # hold it so importing the next blocks cannot evict it
            cache.acquire([present])
            held.append(present)
            continue
        if pair is None or cache.num_free == 0:
            break
        (block,) = cache.allocate(1)
        kv.write_block(block, *pair)
        cache.commit(block, hashes[i], blocks[i], hashes[i - 1] if i else None)
        held.append(block)
        written += 1
    return held, written


def _decode(
    cfg: ModelConfig,
    cache: BlockCache,
    hashes: list[int],
    blocks: list[list[int]],
    kv_blocks: Sequence[tuple[int, bytes]],
) -> list[tuple[np.ndarray, np.ndarray] | None]:
    """(K, V) per given block, None where the block is already cached here."""
    if len(kv_blocks) > len(hashes):
        raise ValueError(
            f"kv_blocks: {len(kv_blocks)} blocks for a sequence of {len(hashes)} full blocks"
        )
    shape = (cfg.n_layers, cfg.block_size, cfg.head_dim)
    decoded: list[tuple[np.ndarray, np.ndarray] | None] = []
    for i, (block_hash, data) in enumerate(kv_blocks):
        if block_hash != hashes[i]:
            raise ValueError(f"kv_blocks[{i}]: hash {block_hash:#x} is not block {i} of the prompt")
        if cache.find(block_hash, blocks[i]) is not None:
            decoded.append(None)
            continue
        try:
            decoded.append(decode_block(data, shape, cfg.fingerprint))
        except ValueError as exc:
            raise ValueError(f"kv_blocks[{i}]: {exc}") from None
    return decoded
