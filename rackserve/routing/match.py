"""PrefixMatch: the index's answer for one request - its cached prefix on every rank and in the pool."""

from __future__ import annotations

from dataclasses import dataclass, field

from rackserve.routing.view import PrefixHit, RankId


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """A request's cached prefix per rank: HBM blocks per rank, pool blocks per starting block.

    rank_blocks: leading blocks of the request in each rank's HBM (ranks with none are absent).
    pool_runs: start block -> (pool_hbm_blocks, pool_dram_blocks) of the contiguous run of pool
      blocks from `start`; holds every start any rank needs (0 and each rank's HBM length).
    """

    block_size: int
    prompt_tokens: int
    rank_blocks: dict[RankId, int] = field(default_factory=dict)
    pool_runs: dict[int, tuple[int, int]] = field(default_factory=dict)

    def hbm_blocks(self, key: RankId) -> int:
        return self.rank_blocks.get(key, 0)

    def hit(self, key: RankId) -> PrefixHit:
        """Cached tokens by tier if the request runs on rank `key`, capped at prompt - 1 tokens
        (the last prompt token is always computed)."""
        return PrefixHit(*self.tokens(self.rank_blocks.get(key, 0)))

    def tokens(self, hbm_blocks: int) -> tuple[int, int, int]:
        """(rank HBM, pool spare-HBM, pool DRAM) cached tokens of a rank holding `hbm_blocks`
        leading blocks in its HBM, as plain ints (what `hit` wraps)."""
        pool_hbm, pool_dram = self.pool_runs.get(hbm_blocks, (0, 0))
        room = self.prompt_tokens - 1 if self.prompt_tokens > 0 else 0
        bs = self.block_size
        t_hbm = hbm_blocks * bs
        if t_hbm >= room:
            return (room, 0, 0)
        t_phbm = pool_hbm * bs
        if t_hbm + t_phbm >= room:
            return (t_hbm, room - t_hbm, 0)
        return (t_hbm, t_phbm, min(pool_dram * bs, room - t_hbm - t_phbm))
