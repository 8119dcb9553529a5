"""rackserve/planner/policies.py: each policy's decisions on hand-made load steps."""

import pytest

from rackserve.planner import InstanceObs, PlannerSettings, Targets, TickObs, make_planner
from rackserve.planner.forecast import CostForecast, RoleShape
from rackserve.planner.policy import Bounds
from rackserve.timing.batch import StepCost

BOUNDS = Bounds(1, 4, 1, 4, prefill_gpus=2, decode_gpus=8, gpu_budget=40)
STEP_TOKENS = 16_384  # per prefill instance: 2 ranks x 8192


def _obs(queued_tokens=0, kv=0.0, prefill=2, decode=2, arrivals=0, running=0, now=30.0, starting=(), ttft=(), itl=()):
    insts = [InstanceObs(f"prefill-{i}", "prefill", "active", 2, queued_prefill_tokens=queued_tokens)
             for i in range(prefill)]
    insts += [InstanceObs(f"decode-{i}", "decode", "active", 8, running_seqs=running // decode, kv_used=kv)
              for i in range(decode)]
    insts += [InstanceObs(name, role, "starting", 2) for name, role in starting]
    return TickObs(now, 30.0, arrivals, 8000.0, 300.0, tuple(ttft), tuple(itl), tuple(insts))


def _planner(policy, context=None, **kw):
    return make_planner(policy, PlannerSettings(policy=policy, **kw), BOUNDS, context or {})


def test_fixed_never_changes():
    p = _planner("fixed")
    for obs in (_obs(queued_tokens=10**7, kv=1.0), _obs(), _obs(arrivals=10_000, running=4000)):
        assert p.decide(obs, Targets(2, 2)) == Targets(2, 2)


def test_load_scales_up_after_a_step_up_and_down_after_a_step_down():
    p = _planner("load", {"prefill_step_tokens": STEP_TOKENS})
    current = Targets(2, 2)
    up = p.decide(_obs(queued_tokens=STEP_TOKENS, kv=0.95), current)  # 1 step queued > 0.5; KV 0.95 > 0.9
    assert up == Targets(3, 3)
    steady = p.decide(_obs(queued_tokens=STEP_TOKENS // 3, kv=0.7, prefill=3, decode=3), up)  # between thresholds
    assert steady == up
    down = p.decide(_obs(queued_tokens=0, kv=0.1, prefill=3, decode=3), up)
    assert down == Targets(2, 2)
    assert p.decide(_obs(queued_tokens=0, kv=0.0, prefill=1, decode=1), Targets(1, 1)) == Targets(1, 1)  # the floor


def test_load_waits_while_an_instance_is_starting():
    p = _planner("load", {"prefill_step_tokens": STEP_TOKENS})
    obs = _obs(queued_tokens=10 * STEP_TOKENS, kv=1.0, starting=[("prefill-3", "prefill")])
    assert p.decide(obs, Targets(3, 2)) == Targets(3, 2)


def test_load_keeps_within_the_gpu_budget():
    bounds = Bounds(1, 4, 1, 4, prefill_gpus=2, decode_gpus=8, gpu_budget=20)  # 2 x 2 + 2 x 8 = 20
    p = make_planner("load", PlannerSettings(policy="load"), bounds, {"prefill_step_tokens": STEP_TOKENS})
    assert p.decide(_obs(queued_tokens=STEP_TOKENS, kv=1.0), Targets(2, 2)) == Targets(2, 2)


class StepTiming:
    """Prefill steps of 1 us per token plus 1 ms; decode steps of 2 ms plus 0.1 ms per sequence."""

    def step_time(self, phase, layout, batch):
        t = max(1e-3 + 1e-6 * float(rb.new_tokens.sum()) for rb in batch.ranks)
        return StepCost(t, {"all": t}, (t,) * len(batch.ranks))

    def decode_token_time(self, layout, batch):
        t = 2e-3 + 1e-4 * max(rb.num_seqs for rb in batch.ranks)
        return StepCost(t, {"all": t}, (t,) * len(batch.ranks))


def _sla(**kw):
    forecast = CostForecast(StepTiming(), RoleShape("dep2", "dep2", 2, 2, chunk_tokens=8192),
                            RoleShape("wide-ep", "wide-ep", 8, 8, max_seqs=256, kv_tokens=10**7), headroom=0.85)
    return _planner("sla", {"forecast": forecast}, ttft_target_s=0.02, itl_target_s=0.01, **kw), forecast


def test_sla_picks_fewer_gpus_at_low_load_than_at_high():
    p, _ = _sla()
    low = p.decide(_obs(arrivals=30 * 20, running=100), Targets(2, 2))  # 20 requests/s
    high = p.decide(_obs(arrivals=30 * 400, running=1200), Targets(2, 2))  # 400 requests/s
    assert BOUNDS.gpus(low) < BOUNDS.gpus(high)
    assert low.prefill < high.prefill and low.decode <= high.decode


def test_sla_meets_the_targets_with_the_fewest_gpus():
    p, f = _sla()
    rate, obs = 100.0, _obs(arrivals=3000, running=800)
    t = p.decide(obs, Targets(1, 1))
    assert f.ttft_s(t.prefill, rate, 8000, 0) <= 0.02 and f.itl_s(t.decode, rate, 300, 8150, 800) <= 0.01
    if t.prefill > 1:
        assert f.ttft_s(t.prefill - 1, rate, 8000, 0) > 0.02
    if t.decode > 1:
        assert f.itl_s(t.decode - 1, rate, 300, 8150, 800) > 0.01


def test_sla_corrects_its_forecast_by_what_it_observed():
    p, f = _sla()
    rate = 100.0
    plain = p.decide(_obs(arrivals=3000, running=800), Targets(2, 2))
    observed = 3 * f.ttft_s(2, rate, 8000, 0)  # the served counts ran three times slower than predicted
    slow = p.decide(_obs(arrivals=3000, running=800, ttft=[observed] * 5), Targets(2, 2))
    assert slow.prefill > plain.prefill


def test_unknown_policy_names_the_field():
    with pytest.raises(ValueError, match="planner.policy"):
        make_planner("nope", PlannerSettings(), BOUNDS, {})


def test_itl_is_infinite_when_the_running_sequences_alone_do_not_fit():
    forecast = CostForecast(StepTiming(), RoleShape("dep2", "dep2", 2, 2, chunk_tokens=8192),
                            RoleShape("wide-ep", "wide-ep", 8, 8, max_seqs=4, kv_tokens=10**7), headroom=0.85)
    # 64 running on 8 ranks is 8 per rank, over max_seqs 4 (it raised OverflowError before)
    assert forecast.itl_s(1, 5.0, 100, 2000, running_seqs=64) == float("inf")
    assert forecast.itl_s(2, 5.0, 100, 2000, running_seqs=64) < float("inf")  # 4 per rank fits
