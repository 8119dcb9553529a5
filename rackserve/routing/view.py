"""The snapshot a routing policy sees: plain frozen dataclasses about ranks and the request.

Policies take these, never a framework object, so the simulator and the live router call the same
code and unit tests build tiny cluster states by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Literal

Role = Literal["prefill", "decode"]
RankId = tuple[str, int]  # (instance, dp_rank)


@dataclass(frozen=True, slots=True)
class RankState:
    """Load of one data-parallel rank of one instance, as the router last heard it.

    queued_tokens: uncached prompt tokens waiting or running in prefill on this rank.
    queued_work_s: seconds of prefill work already queued on this rank (from the timing model).
    active_decode_blocks: KV blocks of sequences decoding on this rank.
    """

    instance: str
    dp_rank: int
    layout: str  # "dep2" | "wide-ep" | "tp8" (rackserve.config.InstanceGroup.layout)
    role: Role
    queued_tokens: int = 0
    queued_work_s: float = 0.0
    active_decode_blocks: int = 0
    running_seqs: int = 0
    healthy: bool = True
    key: RankId = field(init=False, repr=False, compare=False)
    # Prefill load order: queued work, queued tokens, running sequences, then the key.
    load_order: tuple[float, int, int, RankId] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        key = (self.instance, self.dp_rank)
        object.__setattr__(self, "key", key)
        order = (self.queued_work_s, self.queued_tokens, self.running_seqs, key)
        object.__setattr__(self, "load_order", order)


@dataclass(frozen=True, slots=True)
class RequestView:
    """What routing needs of a request: its chained block hashes (full blocks only) and sizes.

    decode_layout: which decode instance type serves it (None = any decode rank).
    """

    block_hashes: tuple[int, ...]
    prompt_tokens: int
    block_size: int
    request_id: str = ""
    decode_layout: str | None = None


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Every rank the router may send to, prefill and decode, in a stable order.

    Derived lookups (healthy prefill ranks by key - `prefill_by_key` - and by load per layout,
    least-loaded decode rank per layout) are computed once at construction so a decision does
    not redo them.
    """

    ranks: tuple[RankState, ...]
    _prefill: tuple[RankState, ...] = field(init=False, repr=False, compare=False)
    prefill_by_key: dict[RankId, RankState] = field(init=False, repr=False, compare=False)
    _by_load: dict[str, tuple[RankState, ...]] = field(init=False, repr=False, compare=False)
    _decode_best: dict[str | None, RankState] = field(init=False, repr=False, compare=False)
    _instances: dict[str, tuple[RankState, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # built once per routing decision of the simulator: per-rank work runs in C (sorted/min
        # with attrgetter keys); min keeps the first of equals, as a strict-less scan would
        prefill = tuple(r for r in self.ranks if r.role == "prefill" and r.healthy)
        by_load: dict[str, list[RankState]] = {}
        for r in sorted(prefill, key=_LOAD_ORDER):
            by_load.setdefault(r.layout, []).append(r)
        decode = [r for r in self.ranks if r.role == "decode" and r.healthy]
        decode_best: dict[str | None, RankState] = {}
        if decode:
            decode_best[None] = min(decode, key=_decode_load)
            for layout in dict.fromkeys(r.layout for r in decode):
                decode_best[layout] = min((r for r in decode if r.layout == layout), key=_decode_load)
        object.__setattr__(self, "_prefill", prefill)
        object.__setattr__(self, "prefill_by_key", {r.key: r for r in prefill})
        object.__setattr__(self, "_by_load", {k: tuple(v) for k, v in by_load.items()})
        object.__setattr__(self, "_decode_best", decode_best)
        object.__setattr__(self, "_instances", prefill_instances(self.ranks))

    def prefill_ranks(self) -> tuple[RankState, ...]:
        """Healthy prefill ranks in view order."""
        return self._prefill

    def prefill_rank(self, key: RankId) -> RankState | None:
        """The healthy prefill rank `key`, or None."""
        return self.prefill_by_key.get(key)

    def prefill_by_load(self) -> dict[str, tuple[RankState, ...]]:
        """Healthy prefill ranks per layout, least loaded first (RankState.load_order)."""
        return self._by_load

    def prefill_instances(self) -> dict[str, tuple[RankState, ...]]:
        """Every prefill rank, healthy or not (lockstep siblings all the same), per instance: instances
        in the order of their first rank, ranks in view order."""
        return self._instances

    def decode_ranks(self, layout: str | None = None) -> tuple[RankState, ...]:
        return tuple(
            r
            for r in self.ranks
            if r.role == "decode" and r.healthy and (layout is None or r.layout == layout)
        )

    def least_loaded_decode(self, layout: str | None = None) -> RankState | None:
        """Healthy decode rank (of `layout`) with the fewest active blocks, then running seqs."""
        return self._decode_best.get(layout)


def prefill_instances(ranks) -> dict[str, tuple[RankState, ...]]:
    """ClusterView.prefill_instances of `ranks` (view order)."""
    out: dict[str, list[RankState]] = {}
    for rank in ranks:
        if rank.role == "prefill":
            out.setdefault(rank.instance, []).append(rank)
    return {k: tuple(v) for k, v in out.items()}


_decode_load = attrgetter("active_decode_blocks", "running_seqs")  # decode load order of a rank
_LOAD_ORDER = attrgetter("load_order")


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """Prompt tokens a rank would not compute, by where their KV is: its own HBM or a pool tier."""

    rank_hbm: int = 0
    pool_hbm: int = 0
    pool_dram: int = 0

    @property
    def total(self) -> int:
        return self.rank_hbm + self.pool_hbm + self.pool_dram


@dataclass(frozen=True, slots=True)
class Scored:
    """A policy's pick: the prefill rank and its score (lower is better; policy-specific units)."""

    rank: RankState
    score: float


@dataclass(frozen=True, slots=True)
class Decision:
    """Where a request goes and what the router expected to find cached there."""

    instance: str
    dp_rank: int
    predicted: PrefixHit
    score: float
    policy: str
    decode_instance: str | None = None
    decode_dp_rank: int | None = None
    # the prefix index's answer the decision was made on (rackserve.routing.match.PrefixMatch)
    match: object = field(default=None, compare=False, repr=False)

    @property
    def key(self) -> RankId:
        return (self.instance, self.dp_rank)


class NoRankAvailable(ValueError):
    """No healthy rank of the needed role (and layout) is in the cluster view."""

    def __init__(self, message: str, role: str) -> None:
        super().__init__(message)
        self.role = role  # "prefill" or "decode": which worker a client is told is unavailable
