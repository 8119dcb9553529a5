"""rackserve/sim/planned.py: the planner in the simulator: start-up delay, drain, attainment, GPU-hours."""

import pytest

from rackserve.planner import Targets
from rackserve.planner.fleet import OFF
from rackserve.sim.scenario import scenario_from_dict
from rackserve.sim.simulator import Simulator
from rackserve.workload.request import Request
from rackserve.workload.source import ListSource

GPUS = {"prefill": 2, "decode": 4}  # dep2, wide-ep 4


def _scenario(planner, prefill=2, decode=2):
    return scenario_from_dict({
        "deployment": {"prefill": [{"layout": "dep2", "count": prefill}],
                       "decode": [{"layout": "wide-ep", "ranks": 4, "count": decode}]},
        "workload": {"kind": "uniform", "requests": 1, "prompt_tokens": 10, "output_tokens": 1},
        "planner": {"tick_s": 2.0, "startup_s": 5.0, **planner},
    })


def _requests(n=200, spacing_s=0.05, prompt=3000, output=50):
    return [Request(i, i * spacing_s, prompt, output, tuple(range(i * 100, i * 100 + prompt // 64)))
            for i in range(n)]


class Scripted:
    """A policy double: the targets of each tick, in order (then the last)."""

    def __init__(self, *targets):
        self.targets = list(targets)

    def decide(self, obs, current):
        return self.targets.pop(0) if len(self.targets) > 1 else self.targets[0]


def _sim(scenario, timing, requests):
    sim = Simulator(scenario, timing, "least-uncached-work", ListSource(requests))
    routed = []
    admit = sim._admit_prefill

    def record(now, flight, seq):
        routed.append((now, flight.prefill[0], flight.decode[0]))
        return admit(now, flight, seq)

    sim._admit_prefill = record
    return sim, routed


def test_an_instance_activated_at_t_takes_no_request_before_t_plus_the_delay(timing):
    sc = _scenario({"policy": "fixed", "initial_prefill": 1, "initial_decode": 1})
    sim, routed = _sim(sc, timing, _requests(n=1200, spacing_s=0.01))  # more than one prefill instance computes
    sim.planner.policy = Scripted(Targets(2, 2))  # at the first tick (t = 2): start one more of each
    result = sim.run()
    ready = 2.0 + 5.0
    assert all(t >= ready for t, p, _ in routed if p == 1)
    assert all(t >= ready for t, _, d in routed if d == 1)
    assert any(p == 1 for _, p, _ in routed) and any(d == 1 for _, _, d in routed)  # used once up
    assert result.completed == len(routed) == 1200


def test_draining_loses_no_request_and_frees_the_gpus(timing):
    sc = _scenario({"policy": "fixed"})  # both of each active from t = 0
    reqs = _requests(n=100, spacing_s=0.03, output=400)  # long decodes: running when the drain starts
    sim, routed = _sim(sc, timing, reqs)
    sim.planner.policy = Scripted(Targets(1, 1))  # at t = 2: drain one of each
    result = sim.run()
    assert result.completed == len(reqs) and result.rejected == 0
    drained = {s.name for s in sim.planner.fleet.slots if s.state == OFF}
    assert drained == {"prefill-1", "decode-1"}
    assert any(t < 2.0 and d == 1 for t, _, d in routed)  # it had work when told to drain
    assert not any(t > 2.0 and (p == 1 or d == 1) for t, p, d in routed)
    held = result.planner["gpus_held"]
    assert held[0] == [0.0, 2 * GPUS["prefill"] + 2 * GPUS["decode"]]
    assert held[-1][1] == GPUS["prefill"] + GPUS["decode"] and held[-1][0] > 2.0  # freed once drained


def test_attainment_and_gpu_hours_arithmetic(timing):
    reqs = _requests(n=60, spacing_s=0.1)
    loose = Simulator(_scenario({"policy": "fixed", "ttft_target_s": 100.0, "itl_target_s": 100.0}),
                      timing, "least-uncached-work", ListSource(reqs)).run()
    p = loose.planner
    assert p["sla_attainment"] == 1.0 and p["requests"] == loose.completed == 60
    gpus = 2 * GPUS["prefill"] + 2 * GPUS["decode"]
    assert p["gpu_hours"] == pytest.approx(gpus * loose.span_s / 3600.0)
    assert p["mean_gpus"] == pytest.approx(gpus)
    target = sorted(loose.ttft_samples)[29]  # the 30th fastest TTFT: 30 of 60 within
    tight = Simulator(_scenario({"policy": "fixed", "ttft_target_s": target, "itl_target_s": 100.0}),
                      timing, "least-uncached-work", ListSource(reqs)).run()
    within = sum(t <= target for t in tight.ttft_samples)
    assert tight.planner["ttft_attainment"] == tight.planner["sla_attainment"] == within / 60
    assert 0 < within < 60
    assert tight.planner["timeline"]["t_s"][:3] == [2.0, 4.0, 6.0]


def test_a_run_without_a_planner_reports_none(timing):
    sc = scenario_from_dict({"deployment": {"prefill": [{"layout": "dep2", "count": 1}],
                                            "decode": [{"layout": "wide-ep", "ranks": 4, "count": 1}]},
                             "workload": {"kind": "uniform", "requests": 1, "prompt_tokens": 10, "output_tokens": 1}})
    result = Simulator(sc, timing, "least-uncached-work", ListSource(_requests(n=5))).run()
    assert result.planner == {} and "planner" not in result.to_dict()


@pytest.mark.parametrize(("planner", "field"), [
    ({"tick_s": 0}, "planner.tick_s"),
    ({"policy": "magic"}, "planner.policy"),
    ({"max_prefill": 5}, "planner.max_prefill"),
    ({"gpu_budget": 3}, "planner.gpu_budget"),
])
def test_bad_planner_input_names_the_field(timing, planner, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        sc = _scenario(planner)
        Simulator(sc, timing, "least-uncached-work", ListSource(_requests(n=2)))


def test_the_timeline_plot_is_written(timing, tmp_path):
    from rackserve.sim.planner_plot import plot_planner_timeline

    result = Simulator(_scenario({"policy": "fixed"}), timing, "least-uncached-work",
                       ListSource(_requests(n=60))).run()
    plot_planner_timeline([result], tmp_path / "planner.png")
    assert (tmp_path / "planner.png").stat().st_size > 0
