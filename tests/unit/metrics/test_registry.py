"""rackserve.metrics.registry: scrapes carry no *_created series, in either text format."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from rackserve.metrics import Registry


def _fill(registry: CollectorRegistry) -> None:
    Counter("demo_requests", "requests", ["code"], registry=registry).labels(code="200").inc(3)
    Histogram("demo_seconds", "latency", registry=registry).observe(0.2)


def test_created_series_are_left_out_and_everything_else_kept():
    plain, ours = CollectorRegistry(), Registry()
    _fill(plain)
    _fill(ours)
    assert "demo_seconds_created" in generate_latest(plain).decode()  # what we drop
    for text in (generate_latest(ours).decode(), generate_openmetrics(ours).decode()):
        assert "_created" not in text
        assert 'demo_requests_total{code="200"} 3.0' in text
        assert "demo_seconds_count 1.0" in text and "demo_seconds_sum 0.2" in text
    families = [f.name for f in ours.collect()]
    assert families == ["demo_requests", "demo_seconds"]
