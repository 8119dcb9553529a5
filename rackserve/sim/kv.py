"""The simulated cluster's KV: each prefill rank's HBM prefix cache, the rack pool, the router index.

Every change a cache or the pool makes is published as KV events and applied to the router's
prefix index at once, so routing sees what the live router would see with zero event lag.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from rackserve.kv.events import EventSequencer, KVEvent, Publisher
from rackserve.kv.pool_tiers import BlockPut, PoolLimits, PoolTiers
from rackserve.routing.index import PrefixIndex
from rackserve.routing.view import PrefixHit, RankId


class RankCache:
    """LRU set of block hashes in one rank's HBM. Stores touch a chain back to front, so the chain's
    head is most recent and eviction takes tails first (prefixes stay matchable)."""

    def __init__(self, capacity_blocks: int, publisher: Publisher) -> None:
        self.capacity = capacity_blocks
        self.evictions = 0
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._seq = EventSequencer(publisher)

    def __len__(self) -> int:
        return len(self._lru)

    def match(self, hashes: Sequence[int]) -> int:
        lru = self._lru
        n = 0
        for h in hashes:
            if h not in lru:
                break
            n += 1
        return n

    def store(self, hashes: Sequence[int], parent: int | None) -> list[KVEvent]:
        lru = self._lru
        new = [h for h in hashes if h not in lru]
        for h in reversed(hashes):
            lru[h] = None
            lru.move_to_end(h)
        events = []
        if new:
            first = list(hashes).index(new[0])
            new_parent = parent if first == 0 else hashes[first - 1]
            events.append(self._seq.make("stored", "rank_hbm", tuple(new), new_parent))
        excess = len(lru) - self.capacity
        if excess > 0:
            gone = [lru.popitem(last=False)[0] for _ in range(excess)]
            self.evictions += excess
            events.append(self._seq.make("removed", "rank_hbm", tuple(gone)))
        return events


class ClusterKV:
    def __init__(self, cache_blocks: dict[RankId, int], pool: PoolLimits, block_tokens: int,
                 block_bytes: int, index: PrefixIndex) -> None:
        self.block_tokens = block_tokens
        self.block_bytes = block_bytes
        self.caches = {key: RankCache(n, Publisher(key[0], key[1])) for key, n in cache_blocks.items()}
        self.pool = PoolTiers(pool)
        self.index = index

    def delivered_hit(self, rank: RankId, hashes: Sequence[int], prompt_tokens: int, now: float) -> PrefixHit:
        """What a rank really finds when it starts a prompt: own HBM, then the pool (capped at prompt-1)."""
        n_rank = self.caches[rank].match(hashes)
        rest = list(hashes[n_rank:])
        pool_match = self.pool.match_prefix(rest, now)
        if pool_match.count:
            self.pool.lookup(rest[: pool_match.count], now, lease=False)  # refresh LRU
        n_phbm = sum(1 for t in pool_match.tiers if t == "pool_hbm")
        room = prompt_tokens - 1
        bs = self.block_tokens
        t_rank = min(n_rank * bs, room)
        t_phbm = min(n_phbm * bs, room - t_rank)
        t_pdram = min((pool_match.count - n_phbm) * bs, room - t_rank - t_phbm)
        return PrefixHit(t_rank, t_phbm, t_pdram)

    def store(self, rank: RankId, hashes: Sequence[int], computed_from: int, now: float) -> None:
        """A rank finished a prompt: its blocks enter the rank's HBM; blocks [computed_from:] (the
        ones it computed) are written to the pool."""
        self.index.apply_all(self.caches[rank].store(hashes, None))
        fresh = hashes[computed_from:]
        if fresh:
            parent = hashes[computed_from - 1] if computed_from else None
            puts = [BlockPut(h, self.block_bytes) for h in fresh]
            res = self.pool.reserve(puts, f"{rank[0]}/{rank[1]}", now, parent_hash=parent)
            if res.to_write:
                self.pool.commit(res.txn, now)
        events, _ = self.pool.drain()
        self.index.apply_all(events)

    def pool_occupancy(self) -> dict[str, float]:
        out = {}
        for tier in ("pool_hbm", "pool_dram"):
            usage = self.pool.usage(tier)
            out[tier] = usage.target_bytes / usage.capacity_bytes if usage.capacity_bytes else 0.0
        return out

    def evictions(self) -> dict[str, int]:
        ev = dict(self.pool.counters.evictions)
        ev["rank_hbm"] = sum(c.evictions for c in self.caches.values())
        return ev


def pool_limits(hbm_bytes: int, dram_bytes: int, high: float, low: float) -> PoolLimits:
    """Simulator pool limits: capacities in target bytes; the actual-byte budget never binds."""
    return PoolLimits(hbm_bytes, dram_bytes, budget_bytes=max(1, hbm_bytes + dram_bytes) * 2,
                      high_watermark=high, low_watermark=low, lease_s=1e18)
