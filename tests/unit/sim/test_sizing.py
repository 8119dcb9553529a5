"""The simulator's sizes of a scenario (rackserve/sim/sizing.py)."""

from __future__ import annotations

from rackserve.sim.run import timing_for
from rackserve.sim.scenario import scenario_from_dict
from rackserve.sim.sizing import prefill_chunk_tokens, size_scenario


def _scenario(sim: dict):
    return scenario_from_dict({
        "deployment": {"prefill": [{"layout": "dep2", "count": 1}], "decode": [{"layout": "tp8", "count": 1}]},
        "sim": sim,
        "workload": {"kind": "uniform", "requests": 1, "prompt_tokens": 10, "output_tokens": 1},
    })


def test_the_chunk_is_a_scenario_knob_and_the_router_prices_with_it():
    """Issue 31 item 4: the engine's prefill chunk (max_num_batched_tokens, or the prefill override)
    caps the prefill step and is the router's reference step (it was a fixed 16,384 the cap never
    allowed)."""
    for sim, chunk in (({}, 8192), ({"max_num_batched_tokens": 4096}, 4096),
                       ({"max_num_batched_tokens": 4096, "prefill_chunk_tokens": 2048}, 2048)):
        sc = _scenario(sim)
        assert prefill_chunk_tokens(sc.sim) == chunk
        assert size_scenario(sc).prefill_chunk_tokens == chunk
        assert timing_for(sc).timing.reference_chunk_tokens == chunk
