"""The rack KV pool's metadata: which block lives in which tier, leases, reservations, eviction.

Pure core (no Redis): the pool service adapts it to gRPC + Redis, the offline simulator uses it
as is. Time is an argument (`now`, seconds), so both clocks work.

Rules:
- Two tiers, `pool_hbm` then `pool_dram`, each with a capacity in *target* bytes (what a block
  weighs in the emulated rack), plus one budget of *actual* bytes (what Redis really holds).
- A put is two-phase: `reserve` books space (a block is invisible until `commit`); a reservation
  that is not committed within `lease_s` is released.
- New blocks go to `pool_hbm`. When an allocation would take a tier above its high watermark,
  LRU blocks are evicted until the tier is at or below its low watermark after the allocation:
  `pool_hbm` blocks are demoted to `pool_dram` (entering it as most recent), `pool_dram` blocks
  are dropped. Blocks under a read lease are never evicted; a lease expires after `lease_s`.
- Every change is a KV event (stored / removed / cleared with its tier), numbered per publisher.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal

from rackserve.config import PoolSection
from rackserve.kv.events import EventSequencer, KVEvent, Publisher

PoolTier = Literal["pool_hbm", "pool_dram"]
POOL_TIERS: tuple[PoolTier, ...] = ("pool_hbm", "pool_dram")
PutStatus = Literal["reserved", "exists", "pending", "no_space"]
POOL_PUBLISHER = Publisher("pool", 0)


@dataclass(frozen=True)
class PoolLimits:
    """Capacities (target bytes per tier, actual bytes overall), watermarks and lease length."""

    hbm_capacity_bytes: int
    dram_capacity_bytes: int
    budget_bytes: int
    high_watermark: float = 0.95
    low_watermark: float = 0.85
    lease_s: float = 30.0
    block_charge_bytes: int = 0  # target bytes of a block whose put names none (0: its actual size)

    def __post_init__(self) -> None:
        assert 0 < self.low_watermark < self.high_watermark <= 1, "watermarks out of order"
        assert min(self.hbm_capacity_bytes, self.dram_capacity_bytes) >= 0 and self.budget_bytes > 0

    @classmethod
    def from_config(cls, pool: PoolSection, block_charge_bytes: int = 0) -> PoolLimits:
        return cls(pool.hbm_capacity_bytes, pool.dram_capacity_bytes, pool.redis_budget_bytes,
                   pool.high_watermark, pool.low_watermark, pool.lease_s, block_charge_bytes)

    def capacity(self, tier: PoolTier) -> int:
        return self.hbm_capacity_bytes if tier == "pool_hbm" else self.dram_capacity_bytes


@dataclass(slots=True)
class _Block:
    block_hash: int
    size: int  # actual bytes in Redis
    charge: int  # target bytes counted against the tier
    owner: str
    tier: PoolTier
    last_use: float
    parent_hash: int | None  # hash preceding this block in the put that stored it (None = root)
    leases: int = 0


@dataclass(slots=True)
class _Pending:
    txn: int
    block: _Block
    expires_at: float


@dataclass(frozen=True, slots=True)
class BlockPut:
    """One block offered to the pool: its hash, actual size and target size (0 = the pool's
    `block_charge_bytes`, or the actual size when that is 0 too)."""

    block_hash: int
    size: int
    target_size: int = 0


@dataclass(frozen=True)
class Reservation:
    """Outcome of `reserve`: per block `reserved` (caller writes bytes, then commits), `exists`
    (already stored), `pending` (another writer holds it) or `no_space` (recompute instead)."""

    txn: int
    statuses: tuple[PutStatus, ...]
    tiers: tuple[PoolTier | None, ...]
    expires_at: float

    @property
    def to_write(self) -> tuple[int, ...]:
        """Indices of the blocks whose bytes the caller must write."""
        return tuple(i for i, s in enumerate(self.statuses) if s == "reserved")



@dataclass(frozen=True)
class Lookup:
    """Outcome of `lookup`: tier of each block (None = miss) and the read lease over the hits."""

    tiers: tuple[PoolTier | None, ...]
    lease_id: int  # 0 = no lease (no hit)
    expires_at: float


@dataclass(frozen=True)
class PoolPrefix:
    count: int
    tiers: tuple[PoolTier, ...]


@dataclass(frozen=True)
class TierUsage:
    keys: int
    bytes: int
    target_bytes: int
    capacity_bytes: int
    reserved_target_bytes: int


@dataclass
class PoolCounters:
    """Monotonic counters since start (the service exports them as Prometheus counters)."""

    puts: int = 0
    put_blocks: int = 0
    committed_blocks: int = 0
    gets: int = 0
    hits: dict[str, int] = field(default_factory=lambda: dict.fromkeys(POOL_TIERS, 0))
    misses: int = 0
    evictions: dict[str, int] = field(default_factory=lambda: dict.fromkeys(POOL_TIERS, 0))
    demotions: int = 0
    lease_expiries: int = 0
    reservation_expiries: int = 0
    alloc_failures: int = 0
    removed_blocks: int = 0
    clears: int = 0


class PoolTiers:
    """All metadata of the pool. Not thread-safe: the service serializes calls with one lock."""

    def __init__(self, limits: PoolLimits, publisher: Publisher = POOL_PUBLISHER) -> None:
        self.limits = limits
        self.counters = PoolCounters()
        self._lru: dict[PoolTier, OrderedDict[int, _Block]] = {t: OrderedDict() for t in POOL_TIERS}
        self._used = dict.fromkeys(POOL_TIERS, 0)  # target bytes, committed + reserved
        self._high = {t: limits.high_watermark * limits.capacity(t) for t in POOL_TIERS}
        self._reserved = dict.fromkeys(POOL_TIERS, 0)
        self._actual_used = 0  # actual bytes, committed + reserved
        self._pending: dict[int, _Pending] = {}
        self._txns: dict[int, dict[int, None]] = {}  # txn -> hashes still reserved (ordered)
        self._txn_heap: list[tuple[float, int]] = []
        self._leases: dict[int, tuple[int, ...]] = {}
        self._lease_heap: list[tuple[float, int]] = []
        self._next_id = 1
        self._sequencer = EventSequencer(publisher)
        self._events: list[tuple[str, PoolTier, list[int], int | None]] = []
        self._dropped: list[int] = []

    # ---- queries -------------------------------------------------------------------------
    def is_known(self, block_hash: int) -> bool:
        """Stored or reserved by someone (its bytes in Redis must not be deleted)."""
        return block_hash in self._pending or self.tier_of(block_hash) is not None

    def tier_of(self, block_hash: int) -> PoolTier | None:
        for tier in POOL_TIERS:
            if block_hash in self._lru[tier]:
                return tier
        return None

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

    def usage(self, tier: PoolTier) -> TierUsage:
        blocks = self._lru[tier].values()
        return TierUsage(len(self._lru[tier]), sum(b.size for b in blocks), sum(b.charge for b in blocks),
                         self.limits.capacity(tier), self._reserved[tier])

    @property
    def actual_bytes(self) -> int:
        return self._actual_used

    @property
    def active_leases(self) -> int:
        return len(self._leases)

    def lru_order(self, tier: PoolTier) -> list[int]:
        """Hashes of a tier from least to most recently used (for tests and the simulator)."""
        return list(self._lru[tier])

    # ---- two-phase put -------------------------------------------------------------------
    def reserve(self, blocks: list[BlockPut], owner: str, now: float, parent_hash: int | None = None) -> Reservation:
        """Book space for the blocks not stored yet. `parent_hash` precedes blocks[0] in its chain."""
        self.expire(now)
        txn, expires_at = self._new_id(), now + self.limits.lease_s
        statuses: list[PutStatus] = []
        tiers: list[PoolTier | None] = []
        booked: list[int] = []
        for i, put in enumerate(blocks):
            parent = parent_hash if i == 0 else blocks[i - 1].block_hash
            status, tier = self._reserve_one(put, owner, now, txn, parent, expires_at)
            statuses.append(status)
            tiers.append(tier)
            if status == "reserved":
                booked.append(put.block_hash)
        self.counters.puts += 1
        self.counters.put_blocks += len(blocks)
        if booked:
            self._txns[txn] = dict.fromkeys(booked)
            heapq.heappush(self._txn_heap, (expires_at, txn))
        return Reservation(txn, tuple(statuses), tuple(tiers), expires_at)

    def _reserve_one(self, put: BlockPut, owner: str, now: float, txn: int, parent: int | None,
                     expires_at: float) -> tuple[PutStatus, PoolTier | None]:
        existing = self.tier_of(put.block_hash)
        if existing is not None:
            return "exists", existing
        if put.block_hash in self._pending:
            return "pending", self._pending[put.block_hash].block.tier
        charge = put.target_size or self.limits.block_charge_bytes or put.size
        tier = self._allocate(charge, put.size)
        if tier is None:
            self.counters.alloc_failures += 1
            return "no_space", None
        block = _Block(put.block_hash, put.size, charge, owner, tier, now, parent)
        self._pending[put.block_hash] = _Pending(txn, block, expires_at)
        self._reserved[tier] += charge
        return "reserved", tier

    def commit(self, txn: int, now: float, hashes: list[int] | None = None) -> tuple[int, ...]:
        """Make a reservation's blocks visible (they enter their tier as most recently used):
        all of them, or only `hashes` (a writer may commit in parts; the rest stay reserved).
        Returns the hashes committed; a reservation that expired first commits nothing (the
        caller's bytes are then orphans; see `is_known`)."""
        self.expire(now)
        booked = self._txns.get(txn)
        if booked is None:
            return ()
        chosen = list(booked) if hashes is None else [h for h in hashes if h in booked]
        committed: list[int] = []
        for h in chosen:
            del booked[h]
            pending = self._pending.pop(h, None)
            if pending is None or pending.txn != txn:
                continue
            block = pending.block
            self._reserved[block.tier] -= block.charge
            block.last_use = now
            self._lru[block.tier][h] = block
            self._emit("stored", block.tier, h, block.parent_hash)
            committed.append(h)
        if not booked:
            del self._txns[txn]
        self.counters.committed_blocks += len(committed)
        return tuple(committed)

    def store(self, blocks: list[BlockPut], owner: str, now: float, parent_hash: int | None = None) -> Reservation:
        """Reserve and commit at once (the simulator has no bytes to move in between)."""
        reservation = self.reserve(blocks, owner, now, parent_hash)
        self.commit(reservation.txn, now)
        return reservation

    def abort(self, txn: int) -> tuple[int, ...]:
        """Release a reservation (the caller could not write the bytes). Returns its hashes."""
        hashes = self._txns.pop(txn, {})
        released = [h for h in hashes if h in self._pending and self._pending[h].txn == txn]
        for h in released:
            self._release_pending(self._pending.pop(h))
        return tuple(released)

    def _release_pending(self, pending: _Pending) -> None:
        block = pending.block
        self._reserved[block.tier] -= block.charge
        self._used[block.tier] -= block.charge
        self._actual_used -= block.size

    # ---- reads ---------------------------------------------------------------------------
    def lookup(self, hashes: list[int], now: float, lease: bool = True) -> Lookup:
        """Tier of each block; hits are refreshed in LRU and (with `lease`) protected until expiry."""
        self.expire(now)
        self.counters.gets += 1
        tiers: list[PoolTier | None] = []
        hits: list[int] = []
        for h in hashes:
            tier = self.tier_of(h)
            tiers.append(tier)
            if tier is None:
                self.counters.misses += 1
                continue
            self.counters.hits[tier] += 1
            block = self._lru[tier][h]
            block.last_use = now
            self._lru[tier].move_to_end(h)
            hits.append(h)
        if not (lease and hits):
            return Lookup(tuple(tiers), 0, now)
        return Lookup(tuple(tiers), self._grant_lease(tuple(hits), now), now + self.limits.lease_s)

    def _grant_lease(self, hashes: tuple[int, ...], now: float) -> int:
        lease_id = self._new_id()
        for h in hashes:
            self._block(h).leases += 1
        self._leases[lease_id] = hashes
        heapq.heappush(self._lease_heap, (now + self.limits.lease_s, lease_id))
        return lease_id

    def release(self, lease_id: int) -> bool:
        """Give a read lease back early. False if it already expired or never existed."""
        hashes = self._leases.pop(lease_id, None)
        if hashes is None:
            return False
        for h in hashes:
            block = self._block(h)
            if block is not None:
                block.leases -= 1
        return True

    # ---- removal, expiry, clear ----------------------------------------------------------
    def remove(self, hashes: list[int]) -> tuple[int, ...]:
        """Drop stored blocks that are not under a lease. Returns the hashes removed."""
        removed = []
        for h in hashes:
            block = self._block(h)
            if block is None or block.leases:
                continue
            self._detach(block)
            self._emit("removed", block.tier, h)
            self._dropped.append(h)
            removed.append(h)
        self.counters.removed_blocks += len(removed)
        return tuple(removed)

    def expire(self, now: float) -> None:
        """Release leases and reservations whose time is up."""
        while self._lease_heap and self._lease_heap[0][0] <= now:
            _, lease_id = heapq.heappop(self._lease_heap)
            if self.release(lease_id):
                self.counters.lease_expiries += 1
        while self._txn_heap and self._txn_heap[0][0] <= now:
            _, txn = heapq.heappop(self._txn_heap)
            self.counters.reservation_expiries += len(self.abort(txn))

    def clear(self) -> tuple[int, ...]:
        """Forget everything (e.g. Redis came back empty); publishes `cleared` for both tiers."""
        dropped = tuple(h for tier in POOL_TIERS for h in self._lru[tier])
        for tier in POOL_TIERS:
            self._lru[tier].clear()
            self._used[tier] = self._reserved[tier] = 0
            self._events.append(("cleared", tier, [], None))
        self._actual_used = 0
        self._pending.clear()
        self._txns.clear()
        self._txn_heap.clear()
        self._leases.clear()
        self._lease_heap.clear()
        self.counters.clears += 1
        return dropped

    def drain(self) -> tuple[list[KVEvent], list[int]]:
        """Events since the last drain (numbered now) and hashes whose bytes must be deleted."""
        events = [self._sequencer.make(kind, tier, tuple(hashes), parent)  # type: ignore[arg-type]
                  for kind, tier, hashes, parent in self._events]
        dropped = self._dropped
        self._events, self._dropped = [], []
        return events, dropped

    # ---- space -----------------------------------------------------------------------------
    def _allocate(self, charge: int, size: int) -> PoolTier | None:
        """Book `charge` target bytes in the first tier that can hold them, and `size` actual bytes."""
        for tier in POOL_TIERS:
            if self._make_room(tier, charge):
                break
        else:
            return None
        if not self._make_budget_room(size):
            return None
        self._used[tier] += charge
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
            for tier in reversed(POOL_TIERS):
                self._evict(tier, target, by_actual=True)
        return self._actual_used + size <= budget

    def _evict(self, tier: PoolTier, target: int, by_actual: bool = False) -> None:
        """Evict LRU unleased blocks of `tier` until its usage (target bytes, or actual bytes
        overall when `by_actual`) is at most `target`. HBM blocks are demoted unless `by_actual`."""
        excess = (self._actual_used if by_actual else self._used[tier]) - target
        victims: list[_Block] = []
        for block in self._lru[tier].values():
            if excess <= 0:
                break
            if block.leases == 0:
                victims.append(block)
                excess -= block.size if by_actual else block.charge
        for block in victims:
            self._detach(block)
            self.counters.evictions[tier] += 1
            self._emit("removed", tier, block.block_hash)
            if tier == "pool_hbm" and not by_actual and self._demote(block):
                continue
            self._dropped.append(block.block_hash)

    def _demote(self, block: _Block) -> bool:
        if not self._make_room("pool_dram", block.charge):
            return False
        block.tier = "pool_dram"
        self._used["pool_dram"] += block.charge
        self._actual_used += block.size
        self._lru["pool_dram"][block.block_hash] = block
        self.counters.demotions += 1
        self._emit("stored", "pool_dram", block.block_hash, block.parent_hash)
        return True

    def _detach(self, block: _Block) -> None:
        del self._lru[block.tier][block.block_hash]
        self._used[block.tier] -= block.charge
        self._actual_used -= block.size

    def _block(self, block_hash: int) -> _Block | None:
        tier = self.tier_of(block_hash)
        return None if tier is None else self._lru[tier][block_hash]

    def _emit(self, kind: str, tier: PoolTier, block_hash: int, parent: int | None = None) -> None:
        """Queue an event, extending the previous one when it continues the same chain."""
        last = self._events[-1] if self._events else None
        if last and last[0] == kind and last[1] == tier and kind != "stored":
            last[2].append(block_hash)
            return
        if last and last[0] == kind == "stored" and last[1] == tier and last[2] and parent == last[2][-1]:
            last[2].append(block_hash)
            return
        self._events.append((kind, tier, [block_hash], parent))

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1
