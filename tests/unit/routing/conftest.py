"""Routing test doubles: a small linear cost model (the core's unit tests may use in-tree doubles)."""

from __future__ import annotations

import pytest

from rackserve.routing import ClusterView, RankState


class LinearCost:
    """prefill = new tokens x per-token seconds of the layout (+ a small context term);
    transfer = tokens x per-token seconds of the tier. Enough to make the orderings checkable."""

    PER_TOKEN_S = {"dep2": 1e-4, "tp8": 0.5e-4, "wide-ep": 2e-4}
    CONTEXT_S = 1e-9  # per new token per context token (attention)
    TRANSFER_S = {"pool_hbm": 1e-6, "pool_dram": 1e-5}

    def prefill_estimate_s(self, layout: str, new_tokens: int, cached_tokens: int) -> float:
        return new_tokens * (
            self.PER_TOKEN_S[layout] + self.CONTEXT_S * (cached_tokens + new_tokens)
        )

    def kv_transfer_s(self, tokens: int, tier: str) -> float:
        return tokens * self.TRANSFER_S[tier]


@pytest.fixture(scope="session")
def cost() -> LinearCost:
    return LinearCost()


def idle_prefill() -> tuple[RankState, ...]:
    return tuple(RankState(f"p{i}", d, "dep2", "prefill") for i in range(2) for d in range(2))


@pytest.fixture
def idle_cluster() -> ClusterView:
    """Two idle DEP2 prefill instances (p0/0, p0/1, p1/0, p1/1), a 4-rank Wide-EP decode
    instance d0 and a TP8 decode instance t0."""
    decode = tuple(RankState("d0", d, "wide-ep", "decode") for d in range(4))
    return ClusterView(idle_prefill() + decode + (RankState("t0", 0, "tp8", "decode"),))
