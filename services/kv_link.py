"""A rank's link to the KV pool: fetch a prompt's leading pooled blocks, store a prompt's blocks.

The P->D hand-off goes through here: the prefill rank stores the prompt's full blocks and hands
their hashes (the KV handle) to the decode rank, which fetches them by hash. The blocks are leased
from the prefill's commit until the decode rank has read them (or the lease expires), so eviction
cannot take them in between; every fetch is leased for the duration of its read too.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.kvpool.client import PoolClient


class PoolLink:
    def __init__(self, address: str, owner: str) -> None:
        self.client = PoolClient(address, owner=owner)

    def fetch(self, hashes: Sequence[int], handoff_lease: int = 0) -> list[tuple[int, bytes, str]]:
        """(hash, bytes, tier) of the contiguous run of `hashes` found in the pool, from the first;
        then the hand-off's lease over them (`store(..., hold=True)`'s, 0 = none) is released."""
        got = self.client.get(list(hashes)) if hashes else None
        self.client.release(handoff_lease)
        if got is None:
            return []
        out = []
        for h, value, tier in zip(hashes, got.values, got.tiers, strict=True):
            if value is None or tier is None:
                break
            out.append((h, value, tier))
        return out

    def store(self, blocks: Sequence[tuple[int, bytes]], hold: bool = False) -> tuple[list[int], int]:
        """Put a prompt's chain of full blocks; return the leading hashes now in the pool and, with
        `hold`, the lease that keeps them there for the reader (0 = none)."""
        if not blocks:
            return [], 0
        hashes = [h for h, _ in blocks]
        result = self.client.put(hashes, [data for _, data in blocks], hold=hold)
        stored = set(result.stored)
        handle = []
        for h in hashes:
            if h not in stored:
                break
            handle.append(h)
        return handle, result.lease_id
