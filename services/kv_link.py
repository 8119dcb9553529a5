"""A rank's link to the KV pool: fetch a prompt's leading pooled blocks, store a prompt's blocks.

The P->D hand-off goes through here: the prefill rank stores the prompt's full blocks and hands
their hashes (the KV handle) to the decode rank, which fetches them by hash.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.kvpool.client import PoolClient


class PoolLink:
    def __init__(self, address: str, owner: str) -> None:
        self.client = PoolClient(address, owner=owner)

    def fetch(self, hashes: Sequence[int]) -> list[tuple[int, bytes, str]]:
        """(hash, bytes, tier) of the contiguous run of `hashes` found in the pool, from the first."""
        if not hashes:
            return []
        got = self.client.get(list(hashes))
        out = []
        for h, value, tier in zip(hashes, got.values, got.tiers, strict=True):
            if value is None or tier is None:
                break
            out.append((h, value, tier))
        return out

    def store(self, blocks: Sequence[tuple[int, bytes]]) -> list[int]:
        """Put a prompt's chain of full blocks; return the leading hashes now in the pool."""
        if not blocks:
            return []
        hashes = [h for h, _ in blocks]
        result = self.client.put(hashes, [data for _, data in blocks])
        stored = set(result.stored)
        handle = []
        for h in hashes:
            if h not in stored:
                break
            handle.append(h)
        return handle
