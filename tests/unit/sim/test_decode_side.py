"""The simulator's decode side priced as the rack runs it (issue 31): newcomers' tail steps are mixed
steps that keep speculation for the running sequences, and `acceptance: sampled` gives each request
its own acceptance."""

from __future__ import annotations

import pytest

from rackserve.sim.run import simulate, timing_for
from rackserve.sim.scenario import scenario_from_dict
from rackserve.workload.request import Request


def _scenario(**timing):
    return scenario_from_dict({
        "timing": {"hardware": "vr200", "model": "deepseek-v4.1-flash", "optimizations": "rubin-optimized", **timing},
        "deployment": {"prefill": [{"layout": "dep2", "count": 2}], "decode": [{"layout": "wide-ep", "ranks": 8, "count": 1}]},
        "workload": {"kind": "uniform", "requests": 1, "prompt_tokens": 10, "output_tokens": 1},
    })


def _requests(n: int, prompt: int, output: int, every_s: float) -> list[Request]:
    """`n` distinct prompts arriving `every_s` apart (each joins a running batch, a newcomer)."""
    blocks = -(-prompt // 64)
    return [Request(i, i * every_s, prompt, output, tuple(range(i * 10_000, i * 10_000 + blocks))) for i in range(n)]


def test_tpot_does_not_depend_on_newcomers_beyond_their_tail_work():
    """Issue 31 item 1. The same arrivals with prompts ending on a block boundary (no tail: a
    newcomer simply joins) and one token short of it (a 63-token tail: every newcomer's first decode
    step computes it): the running sequences keep draft + verify in those steps, so P50 TPOT moves
    by the tails' own work only (<3%). Before, each such step was a plain non-speculative step for the
    whole instance and TPOT rose ~8% here (measured on the code before issue 31)."""
    sc = _scenario()
    timing = timing_for(sc)
    aligned = simulate(sc, _requests(60, 8192, 300, 0.05), timing=timing)
    tailed = simulate(sc, _requests(60, 8192 - 1, 300, 0.05), timing=timing)
    assert aligned.completed == tailed.completed == 60
    assert tailed.tpot_p50_s == pytest.approx(aligned.tpot_p50_s, rel=0.03)


def test_sampled_acceptance_spreads_tpot_around_the_same_mean():
    """`timing.speculative.acceptance: sampled`: each request its own acceptance (the mean of its
    steps' draws), so P90 TPOT carries acceptance variance; `mean` gives every request the same."""
    reqs = _requests(40, 4096, 64, 0.5)  # one at a time: TPOT differs only by acceptance
    mean = simulate(_scenario(), reqs)
    sampled = simulate(_scenario(speculative={"acceptance": "sampled"}), reqs)
    assert mean.completed == sampled.completed == 40
    assert mean.tpot_p90_s == pytest.approx(mean.tpot_p50_s, rel=0.02)
    assert sampled.tpot_p90_s > 1.05 * sampled.tpot_p50_s
    assert sampled.tpot_p50_s == pytest.approx(mean.tpot_p50_s, rel=0.1)
