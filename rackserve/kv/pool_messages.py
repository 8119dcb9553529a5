"""What goes in and out of the pool's metadata: a block offered, a reservation, a lookup, a prefix
match, a tier's usage and the monotonic counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rackserve.kv.pool_limits import POOL_TIERS, PoolTier

PutStatus = Literal["reserved", "exists", "pending", "no_space"]


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
    (already stored), `pending` (another writer holds it) or `no_space` (recompute instead; also
    a block whose parent is neither stored nor being stored: nothing could reach it)."""

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
