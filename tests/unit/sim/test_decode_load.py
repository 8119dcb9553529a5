"""The decode load report (rackserve/sim/decode_load.py): sequences per rank, decode rate against the
modelled capacity at that batch, what bounds each role; no stepping share passed off as load."""

from __future__ import annotations

import pytest

from rackserve.sim.metrics import SimResult
from rackserve.sim.run import simulate
from tests.unit.sim.test_decode_side import _requests, _scenario


def test_decode_load_reports_the_batch_not_the_stepping_share():
    """Issue 31 item 6: decode_util (stepping time / span) read ~1.0 at batch 8 and was taken for
    saturation. It is renamed decode_stepping_share; decode_load gives sequences per rank (mean,
    P90, max), decode tok/s/GPU against the cost model's capacity at that batch, and each role's
    bound."""
    assert "decode_util" not in SimResult.__dataclass_fields__
    res = simulate(_scenario(), _requests(60, 4096, 300, 0.02))
    load = res.decode_load
    assert 0 < load["seqs_per_rank_mean"] <= load["seqs_per_rank_p90"] <= load["seqs_per_rank_max"] <= 60
    assert load["max_num_seqs"] == res.sizing["decode_max_seqs"][0]
    decode_gpus = 8
    assert load["tok_s_per_gpu"] == pytest.approx(res.output_tps_per_gpu * res.gpus / decode_gpus)
    # a lockstep instance stepping back to back at a small batch is far from what more sequences give
    assert load["capacity_tok_s_per_gpu_at_batch"] > 0 and 0 < load["capacity_use"] <= 1.2
    assert load["bound"]["decode"].startswith("load:") and "arrivals" in load["bound"]["prefill"]
    assert res.decode_stepping_share > 0
