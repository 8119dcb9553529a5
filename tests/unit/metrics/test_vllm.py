"""rackserve.metrics.vllm: vLLM's names, types, labels and units, from one known request record."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rackserve.metrics import ProcessMetrics, RequestRecord
from rackserve.metrics.vllm import FINISHED_REASONS, REQUEST_TOKEN_BUCKETS, one_two_five

MODEL = "rackserve-moe-small"
ENGINE = "decode-0/1"
LABELS = frozenset({"model_name": MODEL, "engine": ENGINE}.items())
# vLLM's type of each family it exports (vllm/v1/metrics/loggers.py), under the name a scrape sees.
TYPES = {
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:request_max_num_generation_tokens": "histogram",
    "vllm:iteration_tokens_total": "histogram",
    "vllm:cache_config_info": "gauge",
}


def _request(**over) -> RequestRecord:
    """100 prompt tokens (64 cached), 5 output tokens; queued 0.05 s, first token at 0.25 s, last
    at 0.33 s (simulated seconds)."""
    fields = dict(
        status="finished", prompt_cached_tokens=64, prompt_uncached_tokens=36, output_tokens=5,
        ttft_s=0.25, queue_s=0.05, prefill_s=0.15, kv_transfer_s=0.03, first_decode_s=0.02,
        e2e_s=0.33, inter_token_s=(0.02, 0.02, 0.02, 0.02), decode_engine=ENGINE,
        finish_reason="stop",
    )  # fmt: skip
    return RequestRecord(**{**fields, **over})


def _scrape(m: ProcessMetrics) -> tuple[dict, dict]:
    """(family name -> type, (sample name, labels) -> value) as a Prometheus scraper parses them."""
    types, values = {}, {}
    for family in text_string_to_metric_families(m.exposition().decode()):
        types[family.name] = family.type
        for s in family.samples:
            values[(s.name, frozenset(s.labels.items()))] = s.value
    return types, values


def test_one_request_feeds_every_request_level_series_in_vllm_units():
    m = ProcessMetrics(MODEL)
    m.observe_request(_request())
    _, v = _scrape(m)

    def one(name: str) -> float:
        return v[(name, LABELS)]

    assert one("vllm:prompt_tokens_total") == 100  # cached tokens count: vLLM's prompt length
    assert one("vllm:generation_tokens_total") == 5
    seconds = {
        "vllm:time_to_first_token_seconds": 0.25,
        "vllm:e2e_request_latency_seconds": 0.33,
        "vllm:request_queue_time_seconds": 0.05,
        "vllm:request_prefill_time_seconds": 0.20,  # scheduled (after the queue) to first token
        "vllm:request_decode_time_seconds": 0.08,  # first token to last
        "vllm:request_inference_time_seconds": 0.28,  # prefill + decode
        "vllm:request_time_per_output_token_seconds": 0.02,  # (0.33 - 0.25) / (5 - 1)
    }
    for name, expected in seconds.items():
        assert one(f"{name}_sum") == pytest.approx(expected), name
        assert one(f"{name}_count") == 1, name
    assert one("vllm:inter_token_latency_seconds_count") == 4
    assert one("vllm:inter_token_latency_seconds_sum") == pytest.approx(0.08)
    for name, expected in {"vllm:request_prompt_tokens": 100, "vllm:request_generation_tokens": 5,
                           "vllm:request_max_num_generation_tokens": 5}.items():  # fmt: skip
        assert one(f"{name}_sum") == expected, name
    below = frozenset({**dict(LABELS), "le": "50.0"}.items())
    at = frozenset({**dict(LABELS), "le": "100.0"}.items())
    assert v[("vllm:request_prompt_tokens_bucket", below)] == 0
    assert v[("vllm:request_prompt_tokens_bucket", at)] == 1


def test_request_success_counts_by_finished_reason_with_every_reason_present():
    m = ProcessMetrics(MODEL)
    m.observe_request(_request(finish_reason="stop"))
    m.observe_request(_request(finish_reason="length"))
    m.observe_request(_request(finish_reason=""))  # ran to its budget: length
    m.observe_request(_request(status="aborted", finish_reason=""))
    m.observe_request(_request(status="error", ttft_s=None, e2e_s=None, inter_token_s=()))
    m.observe_request(_request(status="rejected"))  # never reached an engine: not counted
    _, v = _scrape(m)
    success = "vllm:request_success_total"
    by_reason = {
        r: v[(success, frozenset({**dict(LABELS), "finished_reason": r}.items()))]
        for r in FINISHED_REASONS
    }
    assert by_reason == {"stop": 1, "length": 2, "abort": 1, "error": 1, "repetition": 0}
    # The error had no first token: no prompt processed, no phase timed.
    assert v[("vllm:prompt_tokens_total", LABELS)] == 4 * 100
    assert v[("vllm:request_queue_time_seconds_count", LABELS)] == 4
    assert v[("vllm:generation_tokens_total", LABELS)] == 5 * 5


def test_a_one_token_request_records_tpot_zero_as_vllm_does():
    m = ProcessMetrics(MODEL)
    m.observe_request(_request(output_tokens=1, e2e_s=0.25, inter_token_s=()))
    _, v = _scrape(m)
    assert v[("vllm:request_time_per_output_token_seconds_count", LABELS)] == 1
    assert v[("vllm:request_time_per_output_token_seconds_sum", LABELS)] == 0
    assert v[("vllm:request_decode_time_seconds_sum", LABELS)] == 0


def test_iteration_tokens_and_cache_config_carry_the_rank_engine():
    m = ProcessMetrics(MODEL)
    m.vllm.observe_iteration("prefill-0/0", 100)
    m.vllm.observe_iteration("prefill-0/0", 0)  # an empty step is no iteration
    m.vllm.observe_iteration(ENGINE, 8)
    m.vllm.declare_rank(ENGINE, block_size=16, num_gpu_blocks=4096)
    _, v = _scrape(m)
    pre = frozenset({"model_name": MODEL, "engine": "prefill-0/0"}.items())
    assert v[("vllm:iteration_tokens_total_count", pre)] == 1
    assert v[("vllm:iteration_tokens_total_sum", pre)] == 100
    assert v[("vllm:iteration_tokens_total_sum", LABELS)] == 8
    info = {"block_size": "16", "enable_prefix_caching": "True", "num_gpu_blocks": "4096",
            "engine": ENGINE}  # fmt: skip
    assert v[("vllm:cache_config_info", frozenset(info.items()))] == 1


def test_families_have_vllm_types_and_labels_and_no_created_family():
    m = ProcessMetrics(MODEL)
    m.observe_request(_request())
    m.vllm.observe_iteration(ENGINE, 8)
    m.vllm.declare_rank(ENGINE, block_size=16, num_gpu_blocks=4096)
    types, v = _scrape(m)
    assert {n: types.get(n) for n in TYPES} == TYPES
    assert not [n for n in types if n.endswith("_created")]
    assert "_created" not in m.exposition().decode()
    for name, labels in v:
        if not name.startswith("vllm:") or name == "vllm:cache_config_info":
            continue
        keys = {k for k, _ in labels} - {"le", "finished_reason"}
        assert keys == {"model_name", "engine"}, (name, labels)
        if "_seconds" in name and name.endswith("_sum"):
            assert v[(name, labels)] < 1.0, name  # seconds, not milliseconds


def test_request_token_buckets_are_vllms_one_two_five_ladder():
    assert one_two_five(100) == (1, 2, 5, 10, 20, 50, 100)
    assert REQUEST_TOKEN_BUCKETS[:4] == (1, 2, 5, 10) and REQUEST_TOKEN_BUCKETS[-1] == 1_000_000


def test_bad_finish_reason_is_refused():
    with pytest.raises(ValueError, match="finish_reason"):
        _request(finish_reason="eos")
