"""PrefixMatch: the index's answer for one request - its cached prefix on every rank and in the pool."""

from __future__ import annotations

from dataclasses import dataclass, field

from rackserve.routing.view import PrefixHit, RankKey


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """A request's cached prefix per rank: HBM blocks per rank, pool blocks per starting block.

    rank_blocks: leading blocks of the request in each rank's HBM (ranks with none are absent).
    pool_runs: start block -> (pool_hbm_blocks, pool_dram_blocks) of the contiguous run of pool
      blocks from `start`; holds every start any rank needs (0 and each rank's HBM length).
    """

    block_size: int
    prompt_tokens: int
    rank_blocks: dict[RankKey, int] = field(default_factory=dict)
    pool_runs: dict[int, tuple[int, int]] = field(default_factory=dict)

    def hbm_blocks(self, key: RankKey) -> int:
        return self.rank_blocks.get(key, 0)

    def hit(self, key: RankKey) -> PrefixHit:
        """Cached tokens by tier if the request runs on rank `key`, capped at prompt - 1 tokens
        (the last prompt token is always computed)."""
        hbm = self.rank_blocks.get(key, 0)
        pool_hbm, pool_dram = self.pool_runs.get(hbm, (0, 0))
        room = max(0, self.prompt_tokens - 1)
        bs = self.block_size
        t_hbm = min(hbm * bs, room)
        t_phbm = min(pool_hbm * bs, room - t_hbm)
        t_pdram = min(pool_dram * bs, room - t_hbm - t_phbm)
        return PrefixHit(t_hbm, t_phbm, t_pdram)
