"""The simulator's incremental cluster view answers like a ClusterView rebuilt from the same ranks."""

import random

from rackserve.routing.view import ClusterView, RankState
from rackserve.sim.live_view import LiveClusterView


def _ranks() -> list[RankState]:
    out = [RankState(f"prefill-{i}", r, "dep2" if i % 3 else "tp8", "prefill") for i in range(6) for r in range(2)]
    out += [RankState("decode-0", r, "wide-ep", "decode") for r in range(8)]
    out += [RankState("decode-1", r, "dep2", "decode") for r in range(2)]
    return out


def _same(live: LiveClusterView, ref: ClusterView) -> None:
    assert live.ranks == ref.ranks
    assert live.prefill_ranks() == ref.prefill_ranks()
    assert live.prefill_by_key == ref.prefill_by_key
    assert list(live.prefill_by_load().items()) == list(ref.prefill_by_load().items())
    assert list(live.prefill_instances().items()) == list(ref.prefill_instances().items())
    # every prefill rank of each instance, in view order (what least-uncached-work's lockstep terms read)
    assert {k: list(v) for k, v in ref.prefill_instances().items()} == {
        inst: [r for r in ref.ranks if r.role == "prefill" and r.instance == inst] for inst in dict.fromkeys(
            r.instance for r in ref.ranks if r.role == "prefill")}
    for layout in (None, "wide-ep", "dep2", "tp8"):
        assert live.least_loaded_decode(layout) == ref.least_loaded_decode(layout)
        assert live.decode_ranks(layout) == ref.decode_ranks(layout)
    assert live.prefill_rank(("prefill-1", 0)) == ref.prefill_rank(("prefill-1", 0))


def test_live_view_equals_a_rebuilt_cluster_view_after_every_change():
    rng = random.Random(7)
    ranks = _ranks()
    live = LiveClusterView(ranks)
    _same(live, ClusterView(tuple(ranks)))
    for _ in range(600):
        i = rng.randrange(len(ranks))
        r = ranks[i]
        if r.role == "prefill":  # small values so that ties in work and tokens are frequent
            ranks[i] = RankState(r.instance, r.dp_rank, r.layout, r.role, rng.randrange(3), rng.choice((0.0, 0.5, 1.0)),
                                 0, rng.randrange(2))
        else:
            ranks[i] = RankState(r.instance, r.dp_rank, r.layout, r.role, 0, 0.0, rng.randrange(3), rng.randrange(3))
        live.replace(ranks[i])
        _same(live, ClusterView(tuple(ranks)))
