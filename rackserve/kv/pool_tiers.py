"""The rack KV pool's metadata: which block lives in which tier, reservations, eviction.

Pure core (no Redis): the pool service adapts it to gRPC + Redis, the offline simulator uses it
as is. Time is an argument (`now`, seconds), so both clocks work.

Rules:
- Two tiers, `pool_hbm` then `pool_dram`, each with a capacity in *target* bytes (what a block
  weighs in the emulated rack), plus one budget of *actual* bytes (what Redis really holds).
- A put is two-phase: `reserve` books space (a block is invisible until `commit`); a reservation
  that is not committed within `lease_s` is released. A block is stored only after its parent
  (the block before it in its chain): one whose parent is gone could never be matched.
- New blocks go to `pool_hbm`. When an allocation would take a tier above its high watermark,
  LRU blocks are evicted until the tier is at or below its low watermark after the allocation:
  `pool_hbm` blocks are demoted to `pool_dram` (entering it as most recent), `pool_dram` blocks
  are dropped. Eviction is prefix-closed (pool_chains.py): a tail goes before its parent. Blocks
  under a read lease (pool_leases.py) are never evicted; a lease expires after `lease_s`.
- Every change is a KV event (stored / removed / cleared with its tier), numbered per publisher
  (pool_outbox.py queues them until `drain`).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import filterfalse
from operator import attrgetter

from rackserve.kv.events import KVEvent, Publisher
from rackserve.kv.pool_chains import PoolChains, StoredBlock, leading_run
from rackserve.kv.pool_leases import Leases
from rackserve.kv.pool_limits import POOL_TIERS, PoolLimits, PoolTier
from rackserve.kv.pool_messages import (
    BlockPut,
    Lookup,
    PoolCounters,
    PoolPrefix,
    PutStatus,
    Reservation,
    TierUsage,
)
from rackserve.kv.pool_outbox import PoolOutbox
from rackserve.kv.pool_put import PoolPut, _ChainPut, _Pending, _pending_tier

__all__ = ["POOL_PUBLISHER", "POOL_TIERS", "BlockPut", "Lookup", "PoolCounters", "PoolLimits",
           "PoolPrefix", "PoolTier", "PoolTiers", "PutStatus", "Reservation", "TierUsage"]

POOL_PUBLISHER = Publisher("pool", 0)
_SIZE, _CHARGE = attrgetter("size"), attrgetter("charge")


class PoolTiers(PoolPut):
    """All metadata of the pool. Not thread-safe: the service serializes calls with one lock.
    The two-phase put (reserve, commit, abort) is in pool_put.py."""

    def __init__(
        self, limits: PoolLimits, publisher: Publisher = POOL_PUBLISHER, epoch: int = 0
    ) -> None:
        self.limits = limits
        self.counters = PoolCounters()
        self.forgotten = 0  # times a block it knew (stored or reserved) left it: dropped, released, cleared
        self._chains = PoolChains()
        self._leases = Leases(limits.lease_s)
        self._used = dict.fromkeys(POOL_TIERS, 0)  # target bytes, committed + reserved
        self._high = {t: limits.high_watermark * limits.capacity(t) for t in POOL_TIERS}
        self._reserved = dict.fromkeys(POOL_TIERS, 0)
        self._actual_used = 0  # actual bytes, committed + reserved
        self._pending: dict[int, _Pending | _ChainPut] = {}
        self._pinned: Counter[int] = Counter()  # stored parents of reserved blocks: kept in place
        self._waiting: dict[int, set[int]] = {}  # reserved parent -> written children waiting on it
        self._txn_of: dict[int, int] = {}  # stored in this commit call -> its reservation
        self._txns: dict[int, dict[int, None]] = {}  # txn -> hashes still reserved (chain order)
        self._txn_heap: list[tuple[float, int]] = []
        self._next_id = 1
        self._outbox = PoolOutbox(publisher, epoch)  # epoch: the pool process's start

    # ---- queries -------------------------------------------------------------------------
    def is_known(self, block_hash: int) -> bool:
        """Stored or reserved by someone (its bytes in Redis must not be deleted)."""
        return block_hash in self._pending or block_hash in self._chains._all

    def first_unknown(self, chain: Sequence[int]) -> int:
        """Index of a chain's first key not `is_known`, by bisection: what the pool knows of a chain
        (stored or reserved) is a prefix of it, since a block is put only after its parent."""
        return leading_run(chain, len(chain), self._pending, self._chains._all)

    def tier_of(self, block_hash: int) -> PoolTier | None:
        block = self._chains._all.get(block_hash)  # PoolChains.tier_of, one call fewer (the simulator's many)
        return None if block is None else block.tier

    def stored_among(self, hashes: Sequence[int]) -> set[int]:
        """The hashes that are stored (any tier), in one C-level pass."""
        return self._chains.stored_among(hashes)

    def match_prefix(self, hashes: list[int], now: float) -> PoolPrefix:
        """How many leading blocks of a chain are stored, and where (does not refresh LRU)."""
        self.expire(now)
        tiers: list[PoolTier] = []
        for h in hashes:
            tier = self.tier_of(h)
            if tier is None:
                break
            tiers.append(tier)
        return PoolPrefix(len(tiers), tuple(tiers))

    def stored_prefix(self, chain: Sequence[int], now: float) -> tuple[int, int]:
        """(leading blocks stored, of which in pool_hbm) of a chain whose every hash follows the one
        before it (a request's chained block hashes): `match_prefix` in O(log n) lookups, since
        storage and eviction keep the pool prefix-closed and tiers only slow down along a chain."""
        self.expire(now)
        return self._chains.stored_prefix(chain)

    def held_prefix(self, chain: Sequence[int]) -> tuple[int, int]:
        """`stored_prefix` as the pool stands (no expiry first): a router's lookup between the
        pool's own calls (the simulator's index delegates its pool lookups here)."""
        return self._chains.stored_prefix(chain)

    def usage(self, tier: PoolTier) -> TierUsage:
        blocks = self._chains.unordered(tier)
        return TierUsage(len(blocks), sum(map(_SIZE, blocks)), sum(map(_CHARGE, blocks)),
                         self.limits.capacity(tier), self._reserved[tier])

    @property
    def held_target_bytes(self) -> int:
        """Target bytes held in every tier, committed and reserved (O(1), unlike `usage`)."""
        return sum(self._used.values())

    @property
    def actual_bytes(self) -> int:
        return self._actual_used

    @property
    def active_leases(self) -> int:
        return len(self._leases)

    def lru_order(self, tier: PoolTier) -> list[int]:
        """Hashes of a tier from least to most recently used (for tests and the simulator)."""
        return [b.block_hash for b in self._chains.blocks(tier)]

    # ---- reads ---------------------------------------------------------------------------
    def lookup(self, hashes: list[int], now: float, lease: bool = True) -> Lookup:
        """Tier of each block; hits are refreshed in LRU (with their chain's stored ancestors)
        and (with `lease`) protected until expiry."""
        self.expire(now)
        self.counters.gets += 1
        tiers = tuple(self.tier_of(h) for h in hashes)
        hits = tuple(h for h, t in zip(hashes, tiers, strict=True) if t is not None)
        self.counters.misses += len(hashes) - len(hits)
        for tier in tiers:
            if tier is not None:
                self.counters.hits[tier] += 1
        self._chains.touch(list(hits), now)
        return self._lease(tiers, hits, now) if lease else Lookup(tiers, 0, now)

    def lookup_prefix(self, chain: Sequence[int], end: int, now: float) -> None:
        """`lookup([chain[end - 1]], now, lease=False)` for a chain whose first `end` hashes are
        stored (each one's parent the hash before it): the same counters and LRU refresh, in two
        C-level passes (PoolChains.touch_prefix) instead of a walk up the ancestors."""
        assert end > 0, "an empty prefix has no last block to look up"
        self.expire(now)
        self.counters.gets += 1
        self.counters.hits[self._chains._all[chain[end - 1]].tier] += 1
        self._chains.touch_prefix(chain, end)

    def unknown(self, hashes: Iterable[int]) -> list[int]:
        """The hashes neither stored nor reserved (`not is_known`), in order, in one pass."""
        return list(filterfalse(self._chains._all.__contains__, filterfalse(self._pending.__contains__, hashes)))

    def hold(self, hashes: list[int], now: float) -> Lookup:
        """Lease the stored blocks among `hashes` without reading them (no LRU touch, no hit
        counted): a writer keeps the KV it hands to a reader on another rank until the reader
        releases the lease (or it expires)."""
        self.expire(now)
        tiers = tuple(self.tier_of(h) for h in hashes)
        return self._lease(tiers, tuple(h for h, t in zip(hashes, tiers, strict=True) if t is not None), now)

    def _lease(self, tiers: tuple[PoolTier | None, ...], held: tuple[int, ...], now: float) -> Lookup:
        if not held:
            return Lookup(tiers, 0, now)
        return Lookup(tiers, (lease_id := self._new_id()), self._leases.grant(lease_id, held, now))

    def release(self, lease_id: int) -> bool:
        """Give a read lease back early. False if it already expired or never existed."""
        return self._leases.release(lease_id)

    # ---- removal, expiry, clear ----------------------------------------------------------
    def remove(self, hashes: list[int]) -> tuple[int, ...]:
        """Drop stored blocks and the stored blocks chained after them (tails first), unless one
        of them is under a lease. Returns the hashes removed."""
        removed: list[int] = []
        for h in hashes:
            subtree = self._subtree(h)
            if not subtree or any(self._leases.holds(b.block_hash) for b in subtree):
                continue
            for block in reversed(subtree):  # children before their parents
                self._drop(block, "removed")
                removed.append(block.block_hash)
        self.counters.removed_blocks += len(removed)
        return tuple(removed)

    def _subtree(self, block_hash: int) -> list[StoredBlock]:
        """A stored block and every stored block chained after it, parents before children."""
        root = self._chains.get(block_hash)
        out, i = ([root] if root else []), 0
        while i < len(out):
            out += self._chains.children(out[i].block_hash)
            i += 1
        return out

    def expire(self, now: float) -> None:
        """Release leases and reservations whose time is up."""
        self.counters.lease_expiries += self._leases.expire(now)
        while self._txn_heap and self._txn_heap[0][0] <= now:
            _, txn = heapq.heappop(self._txn_heap)
            self.counters.reservation_expiries += len(self.abort(txn))

    def clear(self) -> tuple[int, ...]:
        """Forget everything (e.g. Redis came back empty); publishes `cleared` for both tiers."""
        dropped = tuple(h for tier in POOL_TIERS for h in self.lru_order(tier))
        self._chains.clear()
        for tier in POOL_TIERS:
            self._used[tier] = self._reserved[tier] = 0
            self._outbox.cleared(tier)
        self._actual_used = 0
        self._pending.clear()
        self._pinned.clear()
        self._waiting.clear()
        self._txns.clear()
        self._txn_heap.clear()
        self._leases.clear()
        self.counters.clears += 1
        self.forgotten += 1
        return dropped

    def drain(self) -> tuple[list[KVEvent], list[int]]:
        """Events since the last drain (numbered now) and hashes whose bytes must be deleted."""
        return self._outbox.drain()

    # ---- space -----------------------------------------------------------------------------
    def _tier_after(self, parent: int | None) -> int:
        """The fastest tier a child of `parent` may enter: never one faster than its parent's, so
        along a chain the tiers only get slower (a tail goes before its parent, tier by tier)."""
        if parent is None:
            return 0
        pending = self._pending.get(parent)
        tier = _pending_tier(pending) if pending is not None else self.tier_of(parent)
        return POOL_TIERS.index(tier) if tier is not None else 0

    def _allocate(self, charge: int, size: int, first: int = 0) -> PoolTier | None:
        """Book `charge` target bytes in the first tier from `first` on that can hold them, and
        `size` actual bytes."""
        used, high = self._used, self._high
        for tier in POOL_TIERS[first:]:
            if used[tier] + charge <= high[tier] or self._make_room(tier, charge):
                break
        else:
            return None
        budget = self.limits.budget_bytes  # below the high watermark _make_budget_room is True
        if self._actual_used + size > self.limits.high_watermark * budget and not self._make_budget_room(size):
            return None
        used[tier] += charge
        self._actual_used += size
        return tier

    def _make_room(self, tier: PoolTier, charge: int) -> bool:
        if self._used[tier] + charge <= self._high[tier]:
            return True  # the common case: below the high watermark
        cap = self.limits.capacity(tier)
        if charge > cap:
            return False
        self._evict(tier, int(self.limits.low_watermark * cap) - charge)
        return self._used[tier] + charge <= cap

    def _make_budget_room(self, size: int) -> bool:
        budget = self.limits.budget_bytes
        if size > budget:
            return False
        if self._actual_used + size > self.limits.high_watermark * budget:
            target = int(self.limits.low_watermark * budget) - size
            freed = True
            while freed and self._actual_used > target:  # a pass may free a parent in the other tier
                before = self._actual_used
                for tier in reversed(POOL_TIERS):
                    self._evict(tier, target, by_actual=True)
                freed = self._actual_used < before
        return self._actual_used + size <= budget

    def _evict(self, tier: PoolTier, target: int, by_actual: bool = False) -> None:
        """Evict LRU unleased blocks of `tier`, tails before parents, until its usage (target
        bytes, or actual bytes overall when `by_actual`) is at most `target`. HBM blocks are
        demoted unless `by_actual`; a block that cannot be demoted is dropped if it is a leaf."""
        demote = tier == "pool_hbm" and not by_actual
        for block in self._chains.victims(tier, self._kept, demote):
            used = self._actual_used if by_actual else self._used[tier]
            if used <= target:
                return
            if demote and self._demote(block):
                continue
            if self._chains.is_leaf(block):
                self._drop(block, "evicted")

    def _demote(self, block: StoredBlock) -> bool:
        if not self._make_room("pool_dram", block.charge):
            return False
        self.counters.evictions["pool_hbm"] += 1
        self._used["pool_hbm"] -= block.charge
        self._used["pool_dram"] += block.charge
        self._chains.move(block, "pool_dram")
        self.counters.demotions += 1
        self._outbox.demote(block.block_hash, block.parent_hash)  # removed pool_hbm, stored pool_dram
        return True

    def _drop(self, block: StoredBlock, why: str) -> None:
        """A block leaves the pool: its bytes are to be deleted."""
        self.forgotten += 1
        self._chains.detach(block)
        self._used[block.tier] -= block.charge
        self._actual_used -= block.size
        if why == "evicted":
            self.counters.evictions[block.tier] += 1
        self._outbox.emit("removed", block.tier, block.block_hash)
        self._outbox.delete_bytes(block.block_hash)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1
