"""Routing regret: what a decision cost against the best target in hindsight, in seconds.

A target's cost is least-uncached-work's estimate of when the prompt would finish prefill there
(queued work + compute for what it would not find + pool transfers), priced with the prefix it
really holds (hindsight: the simulator's caches without event lag; the live router's delivered
hit for the chosen rank). Regret = chosen's cost - the cheapest target's, never below 0. Zero for
least-uncached-work with a fresh index and no lockstep term; positive for a stale view or a policy
that prices something else (round-robin, dynamo-kv's blocks).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from rackserve.routing.cost import CostModel
from rackserve.routing.match import PrefixMatch
from rackserve.routing.policies.least_uncached import UncachedWork, uncached_work_s
from rackserve.routing.view import PrefixHit, RankId, RankState, RequestView


def target_cost_s(cost: CostModel, rank: RankState, hit: tuple[int, int, int], prompt_tokens: int) -> float:
    """Seconds until the prompt would finish prefill on `rank` finding `hit` (rank HBM, pool HBM,
    pool DRAM tokens)."""
    return rank.queued_work_s + uncached_work_s(cost, rank.layout, hit, prompt_tokens)


def regret_s(cost: CostModel, request: RequestView, ranks: Iterable[RankState], match: PrefixMatch,
             chosen: RankId, chosen_hit: PrefixHit | None = None, cluster: LoadView | None = None) -> float:
    """Regret of sending `request` to `chosen` among `ranks` (healthy prefill ranks) given the
    hindsight `match`; `chosen_hit` replaces the chosen rank's hit by what it delivered.
    `cluster`: the cluster view `ranks` are the prefill ranks of, where the caller has it: with one
    pool for all (no per-instance pools), a rank holding nothing of the prompt costs its queued work
    plus one price per layout, so the cheapest of those is its layout's least loaded (queued work
    first; adding one price keeps the order, rounding included), and only it, the ranks holding
    part of the prompt and the chosen rank are priced (_regret_by_load: the same value)."""
    if cluster is not None and chosen_hit is None and match.instance_pools is None:
        return _regret_by_load(cost, request, cluster, match, chosen)
    best = float("inf")
    mine = None
    ranks = list(ranks)
    costs = UncachedWork(cost, match, request.prompt_tokens).finish_s(ranks, chosen if chosen_hit is not None else None)
    for rank, c in zip(ranks, costs, strict=True):
        if c is None:  # the chosen rank, priced with what it delivered
            hit = (chosen_hit.rank_hbm, chosen_hit.pool_hbm, chosen_hit.pool_dram)
            c = target_cost_s(cost, rank, hit, request.prompt_tokens)
        if c < best:  # min(best, c)
            best = c
        if rank.key == chosen:
            mine = c
    if mine is None:
        return 0.0
    return max(0.0, mine - best)


class LoadView(Protocol):
    def prefill_rank(self, key: RankId) -> RankState | None: ...

    def prefill_by_load(self) -> dict[str, tuple[RankState, ...]]: ...


def _regret_by_load(cost: CostModel, request: RequestView, view: LoadView, match: PrefixMatch,
                    chosen: RankId) -> float:
    """regret_s over the view's prefill ranks, pricing each layout's least-loaded rank holding
    nothing of the prompt, every rank holding part of it, and the chosen rank."""
    work = UncachedWork(cost, match, request.prompt_tokens)
    held = match.rank_blocks
    best = float("inf")
    mine = None
    for key in (*held, chosen):
        rank = view.prefill_rank(key)
        if rank is None:  # a decode rank's cache, or a rank not in the view
            continue
        c = rank.queued_work_s + work(rank.layout, held.get(key, 0), rank.instance)
        if c < best:
            best = c
        if key == chosen:
            mine = c
    seen = work.seen  # one pool for all (the caller's condition): its memo keys ignore the instance
    for ranks in view.prefill_by_load().values():
        cold = next((r for r in ranks if r.key not in held), None)
        if cold is not None:
            w = seen.get((cold.layout, 0, None))
            c = cold.queued_work_s + (work(cold.layout, 0, cold.instance) if w is None else w)
            if c < best:
                best = c
    if mine is None:
        return 0.0
    return max(0.0, mine - best)
