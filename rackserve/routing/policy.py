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

    overlap_score_weight / temperature: Dynamo's KV-router parameters (dynamo-kv).
    prefix_hash_blocks: how many leading blocks key the consistent hash (prefix-hash).
    """

    cost: CostModel | None = None
    seed: int = 0
    overlap_score_weight: float = 1.0
    temperature: float = 0.0
    prefix_hash_blocks: int = 4


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

