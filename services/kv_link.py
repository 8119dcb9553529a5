"""A rank's link to the KV pool: fetch a prompt's leading pooled blocks, store a prompt's blocks.

The P->D hand-off goes through here: the prefill rank stores the prompt's full blocks and hands
their hashes (the KV handle) to the decode rank, which fetches them by hash. The blocks are leased
from the prefill's commit until the decode rank has read them (or the lease expires), so eviction
cannot take them in between; every fetch is leased for the duration of its read too.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import takewhile

from rackserve.kv.pool_tiers import PoolTier
from services.kvpool.client import PoolClient, Reservation


class PoolLink:
    def __init__(self, address: str, owner: str) -> None:
        self.client = PoolClient(address, owner=owner)

    def fetch(self, hashes: Sequence[int], handoff_lease: int = 0,
              handoff_tiers: Sequence[PoolTier | None] = ()) -> list[tuple[int, bytes, str]]:
        """(hash, bytes, tier) of the contiguous run of `hashes` found in the pool, from the first;
        then the hand-off's lease over them (`store(..., hold=True)`'s, 0 = none) is released.
        With the lease and the tier of each hash as leased (`handoff_tiers`), the bytes are read
        straight from Redis: the lease kept them since the writer's commit, so the pool need not
        be asked where they are (one round trip fewer on the first token's path)."""
        if not hashes:
            self.client.release(handoff_lease)
            return []
        if handoff_lease and len(handoff_tiers) == len(hashes) and all(handoff_tiers):
            got = self.client.read_leased(list(hashes), list(handoff_tiers), handoff_lease)
        else:
            got = self.client.get(list(hashes))
            self.client.release(handoff_lease)
        out = []
        for h, value, tier in zip(hashes, got.values, got.tiers, strict=True):
            if value is None or tier is None:
                break
            out.append((h, value, tier))
        return out

    def reserve(self, hashes: Sequence[int], block_bytes: int) -> Reservation:
        """Book pool space for a prompt's full blocks before they are computed (`store` then
        writes and commits them): the reservation's round trip can overlap the compute."""
        return self.client.reserve(hashes, [block_bytes] * len(hashes))

    def store(self, blocks: Sequence[tuple[int, bytes]], hold: bool = False,
              reservation: Reservation | None = None) -> Handle:
        """Put a prompt's chain of full blocks; return the leading hashes now in the pool and, with
        `hold`, the lease that keeps them there for the reader and their tiers as leased. A
        `reservation` of exactly these hashes with time left is used instead of booking anew
        (otherwise it is given back)."""
        hashes = [h for h, _ in blocks]
        values = [data for _, data in blocks]
        if reservation is not None and not _usable(reservation, hashes, values):
            self.client.abort(reservation)
            reservation = None
        if not blocks:
            return Handle((), 0, ())
        if reservation is None:
            result = self.client.put(hashes, values, hold=hold)
        else:
            result = self.client.complete(reservation, values, hold=hold)
        if result.lease_id and len(result.lease_tiers) == len(hashes):
            tiers = list(takewhile(bool, result.lease_tiers))  # held now: stored, kept for the reader
            return Handle(tuple(hashes[: len(tiers)]), result.lease_id, tuple(tiers))
        stored = set(result.stored)
        handle = tuple(takewhile(stored.__contains__, hashes))
        return Handle(handle, result.lease_id, ())


RESERVE_MARGIN_S = 1.0  # a reservation closer than this to lapsing is given back, not committed


def _usable(res: Reservation, hashes: list[int], values: list[bytes]) -> bool:
    """Did the pool answer `res`, and does it cover exactly these blocks, at their sizes, with
    time left to commit?"""
    return (bool(res.statuses) and list(res.hashes) == hashes
            and list(res.sizes) == [len(v) for v in values]
            and time.monotonic() < res.deadline_s - RESERVE_MARGIN_S)


@dataclass(frozen=True)
class Handle:
    """What a prefill hands a decode rank: the leading stored hashes of the prompt, the lease over
    them (0 = none) and each one's tier as leased (empty: unknown, the reader asks the pool)."""

    hashes: tuple[int, ...]
    lease_id: int
    tiers: tuple[PoolTier | None, ...]
