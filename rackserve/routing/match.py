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
    instance_pools: with a pool per prefill instance (pool.scope instance/agentx), instance ->
      (leading blocks in its pool, of them in pool_hbm); None for one rack-wide pool.
    """

    block_size: int
    prompt_tokens: int
    rank_blocks: dict[RankId, int] = field(default_factory=dict)
    pool_runs: dict[int, tuple[int, int]] = field(default_factory=dict)
    instance_pools: dict[str, tuple[int, int]] | None = None

    def hbm_blocks(self, key: RankId) -> int:
        return self.rank_blocks.get(key, 0)

    def hit(self, key: RankId) -> PrefixHit:
        """Cached tokens by tier if the request runs on rank `key`, capped at prompt - 1 tokens
        (the last prompt token is always computed)."""
        return PrefixHit(*self.tokens(self.rank_blocks.get(key, 0), key[0]))

    def pool_run(self, start: int, instance: str | None = None) -> tuple[int, int]:
        """(pool_hbm, pool_dram) blocks of the pool run from block `start` that a rank of
        `instance` can reach."""
        if self.instance_pools is None:
            return self.pool_runs.get(start, (0, 0))
        end_any, end_hbm = self.instance_pools.get(instance or "", (0, 0))
        in_hbm = max(0, end_hbm - start)
        return in_hbm, max(0, end_any - start) - in_hbm

    def block_tiers(self, key: RankId) -> tuple[int, int, int]:
        """(own HBM, pool spare-HBM, pool DRAM) leading blocks rank `key` would find, uncapped."""
        hbm = self.rank_blocks.get(key, 0)
        return (hbm, *self.pool_run(hbm, key[0]))

    def tokens(self, hbm_blocks: int, instance: str | None = None) -> tuple[int, int, int]:
        """(rank HBM, pool spare-HBM, pool DRAM) cached tokens of a rank (of `instance`, where
        pools are per instance) holding `hbm_blocks` leading blocks in its HBM, as plain ints
        (what `hit` wraps)."""
        pool_hbm, pool_dram = self.pool_run(hbm_blocks, instance)
        room = self.prompt_tokens - 1 if self.prompt_tokens > 0 else 0
        bs = self.block_size
        t_hbm = hbm_blocks * bs
        if t_hbm >= room:
            return (room, 0, 0)
        t_phbm = pool_hbm * bs
        if t_hbm + t_phbm >= room:
            return (t_hbm, room - t_hbm, 0)
        return (t_hbm, t_phbm, min(pool_dram * bs, room - t_hbm - t_phbm))
