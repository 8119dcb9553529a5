"""The routing-policy interface and the registry that picks a policy by name from config.

A policy scores prefill ranks for one request given the cluster view and the prefix match; adding
one is adding one module under rackserve/routing/policies/ that calls `register` (and a line in
that package's __init__). The registry imports no policy: rackserve/routing/__init__.py imports
the policies package, so they are all registered before anything here is reachable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from rackserve.routing.cost import CostModel
from rackserve.routing.match import PrefixMatch
from rackserve.routing.view import ClusterView, RequestView, Scored


@dataclass(frozen=True)
class PolicySettings:
    """Everything any policy may need at construction; each policy reads only its own fields.

    prefill_load_scale / overlap_score_credit / pool_hbm_hit_weight / host_cache_hit_weight /
    temperature: Dynamo's KV-router parameters (dynamo-kv; config.RoutingSection says where from).
    overlap_score_weight: Dynamo's deprecated name, kept for old configs: when given, it is the
    prefill_load_scale, and 0 also turns the overlap credit off (as Dynamo maps it).
    lockstep_balance: least-uncached-work charges the idle a pick forces on lockstep siblings.
    prefix_hash_blocks: how many leading blocks key the consistent hash (prefix-hash).
    """

    cost: CostModel | None = None
    seed: int = 0
    overlap_score_weight: float | None = None
    prefill_load_scale: float = 1.0
    overlap_score_credit: float = 1.0
    pool_hbm_hit_weight: float = 0.75
    host_cache_hit_weight: float = 0.75
    temperature: float = 0.0
    lockstep_balance: bool = True
    prefix_hash_blocks: int = 4

    def dynamo_scale_and_credit(self) -> tuple[float, float]:
        """(prefill_load_scale, device overlap credit) after the deprecated overlap_score_weight."""
        w = self.overlap_score_weight
        if w is None:
            return self.prefill_load_scale, self.overlap_score_credit
        return w, (0.0 if w == 0 else self.overlap_score_credit)


class Policy(Protocol):
    name: str

    def choose(self, request: RequestView, cluster: ClusterView, match: PrefixMatch) -> Scored:
        """Pick one of `cluster.prefill_ranks()` (never empty) for `request`."""
        ...


PolicyFactory = Callable[[PolicySettings], Policy]
_REGISTRY: dict[str, PolicyFactory] = {}


def register(name: str) -> Callable[[PolicyFactory], PolicyFactory]:
    """Class decorator: make a policy constructible by `make_policy(name, ...)`."""

    def wrap(factory: PolicyFactory) -> PolicyFactory:
        assert name not in _REGISTRY, f"policy {name!r} registered twice"
        _REGISTRY[name] = factory
        return factory

    return wrap


def policy_names() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def make_policy(name: str, settings: PolicySettings | None = None) -> Policy:
    """Build the policy registered as `name`; ValueError naming it (and the known ones) otherwise."""
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(
            f"routing.policy: unknown policy {name!r}; known: {', '.join(sorted(_REGISTRY))}"
        )
    return factory(settings or PolicySettings())

