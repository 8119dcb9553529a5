"""The pool's tiers and limits: capacities in target bytes per tier, one budget of actual bytes,
watermarks and the lease length."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rackserve.config import PoolSection

PoolTier = Literal["pool_hbm", "pool_dram"]
POOL_TIERS: tuple[PoolTier, ...] = ("pool_hbm", "pool_dram")  # fastest first


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
