"""Decode placement: the decode rank with the fewest active KV blocks among the requested type."""

from __future__ import annotations

from rackserve.routing.view import ClusterView, NoRankAvailable, RankState


def place_decode(cluster: ClusterView, layout: str | None = None) -> RankState | None:
    """Least-loaded healthy decode rank (active blocks, then running sequences, then view order).

    None when the view has no decode ranks at all (aggregated serving); NoRankAvailable when it
    has some but none healthy of `layout`.
    """
    best = cluster.least_loaded_decode(layout)
    if best is None and any(r.role == "decode" for r in cluster.ranks):
        raise NoRankAvailable(f"decode_layout: no healthy decode rank of layout {layout!r}", "decode")
    return best
