"""rackserve.metrics: names, labels and values as a Prometheus scraper would parse them."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rackserve.metrics import (
    TIERS,
    ProcessMetrics,
    RankKey,
    RequestRecord,
    metric_names,
)

MODEL = "rackserve-moe-small"
VLLM_NAMES = {
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions",
}


def _samples(metrics: ProcessMetrics) -> dict[tuple[str, frozenset], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _one_request() -> RequestRecord:
    return RequestRecord(
        status="finished",
        prompt_cached_tokens=64,
        prompt_uncached_tokens=36,
        output_tokens=5,
        ttft_s=0.25,
        queue_s=0.05,
        prefill_s=0.15,
        kv_transfer_s=0.03,
        first_decode_s=0.02,
        e2e_s=0.33,
        inter_token_s=(0.02, 0.02, 0.02, 0.02),
        decode_engine="decode-0/1",
    )


def test_every_vllm_name_is_registered_with_model_and_engine_labels():
    m = ProcessMetrics(MODEL)
    assert VLLM_NAMES <= set(metric_names(m.registry))
    m.observe_request(_one_request())
    m.observe_prefix_lookup(RankKey("prefill-0", 0, "prefill"), {"rank_hbm": 64, "miss": 36})
    m.observe_rank_state(RankKey("decode-0", 1, "decode"), 3, 2, 0, 25, 100)
    m.observe_preemptions(RankKey("decode-0", 1, "decode"), 1)
    seen = {name for name, _ in _samples(m)}
    for name in VLLM_NAMES:
        base = {name, f"{name}_total", f"{name}_count"}
        assert base & seen, name
    s = _samples(m)
    lab = frozenset({"model_name": MODEL, "engine": "decode-0/1"}.items())
    assert s[("vllm:time_to_first_token_seconds_sum", lab)] == pytest.approx(0.25)
    assert s[("vllm:inter_token_latency_seconds_count", lab)] == 4
    assert s[("vllm:kv_cache_usage_perc", lab)] == pytest.approx(0.25)
    assert s[("vllm:num_requests_waiting", lab)] == 2
    pre = frozenset({"model_name": MODEL, "engine": "prefill-0/0"}.items())
    assert s[("vllm:prefix_cache_queries_total", pre)] == 100
    assert s[("vllm:prefix_cache_hits_total", pre)] == 64


def test_front_door_request_records_ttft_breakdown_tpot_and_tokens():
    m = ProcessMetrics(MODEL)
    m.observe_request(_one_request())
    s = _samples(m)
    ml = frozenset({"model_name": MODEL}.items())
    assert s[("rackserve_time_to_first_token_seconds_sum", ml)] == pytest.approx(0.25)
    # TPOT = (e2e - ttft) / (output - 1) = 0.08 / 4
    assert s[("rackserve_time_per_output_token_seconds_sum", ml)] == pytest.approx(0.02)
    comp = {
        c: s[("rackserve_ttft_component_seconds_sum", frozenset({"component": c}.items()))]
        for c in ("queue", "prefill", "kv_transfer", "first_decode")
    }
    assert comp == pytest.approx(
        {"queue": 0.05, "prefill": 0.15, "kv_transfer": 0.03, "first_decode": 0.02}
    )
    assert sum(comp.values()) == pytest.approx(0.25)
    assert s[("rackserve_requests_total", frozenset({"status": "finished"}.items()))] == 1
    kinds = {
        k: s[("rackserve_tokens_total", frozenset({"kind": k}.items()))]
        for k in ("cached", "uncached", "output")
    }
    assert kinds == {"cached": 64, "uncached": 36, "output": 5}


def test_rank_series_carry_instance_dp_rank_role_and_idle_time():
    m = ProcessMetrics(MODEL)
    busy, idle = RankKey("decode-0", 0, "decode"), RankKey("decode-0", 1, "decode")
    # Lockstep: the step lasts 10 ms; rank 1 had less work (4 ms) and idled the rest.
    m.ranks.record_step(busy, busy_s=0.010, idle_s=0.0, batch_size=8)
    m.ranks.record_step(idle, busy_s=0.004, idle_s=0.006, batch_size=2)
    s = _samples(m)
    lab0, lab1 = (frozenset(k.labels().items()) for k in (busy, idle))
    assert s[("rackserve_rank_idle_seconds_total", lab0)] == 0
    assert s[("rackserve_rank_idle_seconds_total", lab1)] == pytest.approx(0.006)
    assert s[("rackserve_rank_busy_seconds_total", lab1)] == pytest.approx(0.004)
    assert s[("rackserve_rank_batch_size", lab1)] == 2
    assert dict(lab1) == {"instance": "decode-0", "dp_rank": "1", "role": "decode"}


def test_predicted_and_delivered_cached_tokens_and_tiers():
    m = ProcessMetrics(MODEL)
    rank = RankKey("prefill-1", 1, "prefill")
    m.cache.record_decision_outcome(rank, predicted=128, delivered=96)
    m.observe_prefix_lookup(rank, dict(zip(TIERS, (16, 32, 48, 8), strict=True)))
    s = _samples(m)
    lab = frozenset(rank.labels().items())
    assert s[("rackserve_router_predicted_cached_tokens_total", lab)] == 128
    assert s[("rackserve_delivered_cached_tokens_total", lab)] == 96
    assert s[("rackserve_cached_tokens_prediction_error_tokens_sum", frozenset())] == 32
    tiers = {
        t: s[("rackserve_prefix_tokens_total", frozenset({**rank.labels(), "tier": t}.items()))]
        for t in TIERS
    }
    assert tiers == {"rank_hbm": 16, "pool_hbm": 32, "pool_dram": 48, "miss": 8}


def test_pacing_lag_counts_only_overruns():
    m = ProcessMetrics(MODEL)
    rank = RankKey("prefill-0", 0, "prefill")
    m.ranks.record_pacing(rank, -0.5)
    m.ranks.record_pacing(rank, 0.25)
    s = _samples(m)
    lab = frozenset(rank.labels().items())
    assert s[("rackserve_rank_pacing_lag_seconds_total", lab)] == pytest.approx(0.25)
    assert s[("rackserve_rank_lagging_steps_total", lab)] == 1


def test_gauges_are_never_named_total_and_names_are_prefixed():
    m = ProcessMetrics(MODEL)
    for family in m.registry.collect():
        assert family.name.startswith(("rackserve_", "vllm:")), family.name
        if family.type == "gauge":
            assert not family.name.endswith("_total"), family.name


def test_registries_are_per_process_objects():
    a, b = ProcessMetrics(MODEL), ProcessMetrics(MODEL)
    a.front_door.requests.labels(status="error").inc()
    s = _samples(b)
    assert ("rackserve_requests_total", frozenset({"status": "error"}.items())) not in s


@pytest.mark.parametrize(
    "bad",
    [
        lambda: RankKey("p", 0, "verifier"),
        lambda: RankKey("p", -1, "prefill"),
        lambda: RequestRecord(
            status="ok", prompt_cached_tokens=0, prompt_uncached_tokens=0, output_tokens=0
        ),
        lambda: ProcessMetrics(MODEL).cache.record_lookup(RankKey("p", 0, "prefill"), {"l3": 1}),
    ],
)
def test_bad_label_values_raise_value_error(bad):
    with pytest.raises(ValueError):
        bad()


def test_instance_gpus_and_tokens_by_kind():
    m = ProcessMetrics(MODEL)
    m.ranks.declare_instance("decode-wide-ep-0", "decode", 4)
    m.ranks.record_instance_tokens("decode-wide-ep-0", "decode", {"output": 7})
    m.ranks.record_instance_tokens("decode-wide-ep-0", "decode", {"output": 5})
    s = _samples(m)
    il = {"instance": "decode-wide-ep-0", "role": "decode"}
    assert s[("rackserve_instance_gpus", frozenset(il.items()))] == 4
    assert s[("rackserve_instance_tokens_total", frozenset({**il, "kind": "output"}.items()))] == 12
    with pytest.raises(ValueError):
        m.ranks.record_instance_tokens("decode-wide-ep-0", "decode", {"input": 1})


def test_pool_tier_occupancy():
    m = ProcessMetrics(MODEL)
    m.pool.record_tier("pool_dram", blocks=3, used_bytes=300, capacity_bytes=1000)
    m.pool.evictions.labels(tier="pool_hbm").inc(2)
    s = _samples(m)
    assert s[("rackserve_pool_used_bytes", frozenset({"tier": "pool_dram"}.items()))] == 300
    assert s[("rackserve_pool_evictions_total", frozenset({"tier": "pool_hbm"}.items()))] == 2
    with pytest.raises(ValueError):
        m.pool.record_tier("rank_hbm", 0, 0, 0)


def test_preemptions_are_counted_per_engine_under_the_vllm_name():
    m = ProcessMetrics("m")
    m.observe_preemptions(RankKey("decode-0", 1, "decode"), 3)
    m.observe_preemptions(RankKey("decode-0", 1, "decode"), 2)
    text = m.exposition().decode()
    assert 'vllm:num_preemptions_total{engine="decode-0/1",model_name="m"} 5.0' in text


def test_engine_label_is_one_engine_not_a_migration_path():
    with pytest.raises(ValueError, match="decode_engine"):
        RequestRecord(status="finished", prompt_cached_tokens=0, prompt_uncached_tokens=1,
                      output_tokens=1, decode_engine="decode-0/0->decode-1/0")
    m = ProcessMetrics(MODEL)
    m.router.migrations.labels(from_role="decode", to_role="decode").inc()
    key = ("rackserve_migrations_total", frozenset({"from_role": "decode", "to_role": "decode"}.items()))
    assert _samples(m)[key] == 1.0
