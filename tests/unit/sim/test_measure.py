"""Measured like AgentX: warm-up requests are left out; only the measured window counts."""

from dataclasses import dataclass

import pytest

from rackserve.sim.scenario import scenario_from_dict
from rackserve.sim.simulator import Simulator
from rackserve.workload.request import Request
from rackserve.workload.source import ListSource


@dataclass(frozen=True)
class WarmupRequest(Request):  # stands in until the trace workload marks its warm-up turns
    warmup: bool = True


def _scenario(sim=None):
    return scenario_from_dict({
        "deployment": {"prefill": [{"layout": "dep2", "count": 1}],
                       "decode": [{"layout": "wide-ep", "ranks": 2, "count": 1}]},
        "sim": sim or {},
        "workload": {"kind": "uniform", "requests": 1, "prompt_tokens": 10, "output_tokens": 1},
    })


def test_warmup_requests_are_sent_but_left_out_of_the_figures(timing):
    warm = WarmupRequest(0, 0.0, 5000, 50, tuple(range(78)))
    real = Request(1, 1.0, 640, 20, tuple(range(1000, 1010)))
    res = Simulator(_scenario(), timing, "least-uncached-work", ListSource([warm, real])).run()
    assert res.completed == 1 and res.arrivals == 1
    assert res.throughput_per_gpu * res.span_s * res.gpus == pytest.approx(640 + 20)


def test_only_requests_finishing_inside_the_window_count_over_its_length(timing):
    reqs = [Request(i, float(i), 640, 10, tuple(range(i * 100, i * 100 + 10))) for i in range(10)]
    res = Simulator(_scenario({"measure_start_s": 3.0, "measure_duration_s": 4.0}), timing,
                    "least-uncached-work", ListSource(reqs)).run()
    assert res.completed == 4  # arrivals at 3, 4, 5, 6 s finish inside [3, 7): each takes ~30 ms
    assert res.span_s == 4.0
    assert res.throughput_per_gpu == pytest.approx(4 * 650 / 4.0 / res.gpus)


def test_warmup_first_moves_the_measured_window_to_the_release(timing, tmp_path):
    import json

    from rackserve.sim.run import source_factory
    from tests.unit.workload.conversations import chain

    trace = tmp_path / "convs.jsonl"
    trace.write_text("".join(json.dumps(chain(12, f"c{i}", first=64 * 200)) + "\n" for i in range(4)))
    sc = scenario_from_dict({
        "deployment": {"prefill": [{"layout": "dep2", "count": 1}],
                       "decode": [{"layout": "wide-ep", "ranks": 2, "count": 1}]},
        "workload": {"kind": "agentx-trace", "trace": str(trace), "concurrency": 8, "duration_s": 100.0,
                     "measure_start_s": 5.0, "measure_s": 60.0, "warmup_first": True},
    })
    src = source_factory(sc)()
    sim = Simulator(sc, timing, "least-uncached-work", src)
    res = sim.run()
    assert src.released_at_s is not None and src.released_at_s > 0.0  # the last warm-up's end
    assert sim.metrics.window_start_s == pytest.approx(src.released_at_s + 5.0)
    assert sim.metrics.window_end_s == pytest.approx(src.released_at_s + 65.0)
    assert res.warmup_requests == 8 and res.completed > 0 and res.span_s == pytest.approx(60.0)
