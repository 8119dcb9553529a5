"""prefix-hash: consistent hashing of the request's first blocks onto a ring of prefill ranks.

Requests sharing their first `prefix_hash_blocks` blocks land on the same rank without any index;
a rank leaving or joining moves only its own share of keys (virtual nodes smooth the shares).
"""

from __future__ import annotations

import bisect

import xxhash

from rackserve.routing.match import PrefixMatch
from rackserve.routing.policy import PolicySettings, register
from rackserve.routing.view import ClusterView, RankId, RequestView, Scored

_VNODES = 64  # ring points per rank


def _ring(keys: tuple[RankId, ...]) -> tuple[list[int], list[int]]:
    points = sorted(
        (xxhash.xxh3_64_intdigest(f"{inst}/{dp}#{v}".encode()), i)
        for i, (inst, dp) in enumerate(keys)
        for v in range(_VNODES)
    )
    return [p for p, _ in points], [i for _, i in points]


@register("prefix-hash")
class PrefixHash:
    name = "prefix-hash"

    def __init__(self, settings: PolicySettings) -> None:
        if settings.prefix_hash_blocks <= 0:
            raise ValueError(
                f"routing.prefix_hash_blocks must be positive, got {settings.prefix_hash_blocks}"
            )
        self._blocks = settings.prefix_hash_blocks
        self._rings: dict[tuple[RankId, ...], tuple[list[int], list[int]]] = {}

    def choose(self, request: RequestView, cluster: ClusterView, match: PrefixMatch) -> Scored:
        ranks = cluster.prefill_ranks()
        keys = tuple(r.key for r in ranks)
        ring = self._rings.get(keys)
        if ring is None:
            ring = self._rings[keys] = _ring(keys)
        points, owners = ring
        hashes = request.block_hashes
        # A chained hash names its whole prefix: block k-1's hash keys the first k blocks.
        key = hashes[min(self._blocks, len(hashes)) - 1] if hashes else 0
        slot = bisect.bisect_left(points, key) % len(points)
        return Scored(ranks[owners[slot]], float(slot))
