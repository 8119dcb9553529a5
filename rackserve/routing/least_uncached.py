"""least-uncached-work: send the prompt where it finishes prefill soonest, by the timing model.

Cost of a rank = work already queued there + compute for tokens cached nowhere it can reach +
transfer for tokens found in the pool (by tier) + nothing for tokens in its own HBM. Times come
from the cost model, so heterogeneous layouts compare fairly; ties go to the less loaded rank.
"""

from __future__ import annotations

from rackserve.routing.cost import CostModel
from rackserve.routing.index import PrefixMatch
from rackserve.routing.policy import PolicySettings, register
from rackserve.routing.view import PrefixHit, RankState, RequestView, Scored

_TIE_DIGITS = 9  # costs equal to the nanosecond count as a tie


def uncached_work_s(cost: CostModel, layout: str, hit: PrefixHit, prompt_tokens: int) -> float:
    """Seconds of new work a request adds on a rank of `layout` that would find `hit` cached."""
    cached = hit.total
    seconds = cost.prefill_estimate_s(layout, prompt_tokens - cached, cached)
    if hit.pool_hbm:
        seconds += cost.kv_transfer_s(hit.pool_hbm, "pool_hbm")
    if hit.pool_dram:
        seconds += cost.kv_transfer_s(hit.pool_dram, "pool_dram")
    return seconds


@register("least-uncached-work")
class LeastUncachedWork:
    name = "least-uncached-work"

    def __init__(self, settings: PolicySettings) -> None:
        if settings.cost is None:
            raise ValueError("routing.policy: least-uncached-work needs a cost model (timing)")
        self._cost = settings.cost

    def choose(
        self, request: RequestView, ranks: tuple[RankState, ...], match: PrefixMatch
    ) -> Scored:
        # Most ranks share (layout, HBM hit): price each distinct pair once.
        priced: dict[tuple[str, int], float] = {}
        best: RankState = ranks[0]
        best_key: tuple[float, int, int] | None = None
        for rank in ranks:
            pair = (rank.layout, match.hbm_blocks(rank.key))
            work = priced.get(pair)
            if work is None:
                hit = match.hit(rank.key)
                work = priced[pair] = uncached_work_s(
                    self._cost, rank.layout, hit, request.prompt_tokens
                )
            key = (
                round(rank.queued_work_s + work, _TIE_DIGITS),
                rank.queued_tokens,
                rank.running_seqs,
            )
            if best_key is None or key < best_key:
                best, best_key = rank, key
        assert best_key is not None
        return Scored(best, best_key[0])
