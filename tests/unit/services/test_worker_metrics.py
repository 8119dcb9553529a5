"""The front door's merged /metrics: each series once, the router's value where the router has it
(the issue: rackserve_requests_in_flight appeared three times, 64, 0, 0)."""

from __future__ import annotations

from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

from rackserve.metrics import ProcessMetrics, RankKey
from services.router.worker_metrics import merge_expositions


def _series(text: str) -> Counter:
    return Counter(
        (s.name, frozenset(s.labels.items()))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    )


def test_merge_keeps_each_series_once_and_the_routers_values():
    router, prefill, decode = ProcessMetrics("m"), ProcessMetrics("m"), ProcessMetrics("m")
    router.front_door.in_flight.set(64)
    prefill.observe_rank_state(RankKey("prefill-0", 0, "prefill"), 1, 0, 10, 5, 100)
    decode.observe_rank_state(RankKey("decode-0", 1, "decode"), 3, 2, 0, 25, 100)
    text = merge_expositions(
        [router.exposition().decode(), prefill.exposition().decode(), decode.exposition().decode()]
    ).decode()
    series = _series(text)
    assert [k for k, n in series.items() if n > 1] == []
    in_flight = [s for f in text_string_to_metric_families(text) for s in f.samples
                 if s.name == "rackserve_requests_in_flight"]
    assert [s.value for s in in_flight] == [64.0]
    running = {s.labels["engine"]: s.value for f in text_string_to_metric_families(text)
               for s in f.samples if s.name == "vllm:num_requests_running"}
    assert running == {"prefill-0/0": 1.0, "decode-0/1": 3.0}  # the workers' own series kept
