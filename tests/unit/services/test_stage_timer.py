"""The per-stage wall-time histogram: the ASGI arrival stamp reaches the handler, a stage is
observed once per hop with its elapsed time, and nothing is stamped outside a request."""

from __future__ import annotations

import asyncio
import time

from rackserve.metrics import ProcessMetrics
from services.stage_timer import STAGES, arrived_s, now_s, observe, stamp_arrival

FAMILY = "rackserve_frontdoor_stage_wall_seconds"


def sample(metrics: ProcessMetrics, stage: str, suffix: str) -> float:
    value = metrics.registry.get_sample_value(f"{FAMILY}_{suffix}", {"stage": stage})
    return value or 0.0


def test_the_handler_sees_its_requests_arrival_and_observes_its_stage() -> None:
    metrics = ProcessMetrics("m")
    seen: list[float | None] = []

    async def handler(scope, receive, send) -> None:
        seen.append(arrived_s())
        time.sleep(0.002)  # the hop takes at least 2 ms
        observe(metrics, "http_in", seen[-1])

    app = stamp_arrival(handler)
    before = now_s()
    asyncio.run(app({"type": "http"}, None, None))
    assert seen[0] is not None and seen[0] >= before
    assert sample(metrics, "http_in", "count") == 1
    assert 0.002 <= sample(metrics, "http_in", "sum") < 1.0


def test_no_arrival_outside_an_http_request() -> None:
    seen: list[float | None] = []

    async def handler(scope, receive, send) -> None:
        seen.append(arrived_s())

    asyncio.run(stamp_arrival(handler)({"type": "lifespan"}, None, None))
    assert seen == [None]


def test_every_stage_is_a_label_of_the_one_histogram() -> None:
    metrics = ProcessMetrics("m")
    for stage in STAGES:
        observe(metrics, stage, now_s())
    assert all(sample(metrics, stage, "count") == 1 for stage in STAGES)
    assert len(set(STAGES)) == len(STAGES)


def test_first_byte_is_observed_once_when_a_posts_body_leaves_the_app() -> None:
    metrics = ProcessMetrics("m")
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def handler(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        time.sleep(0.002)  # the first event takes at least 2 ms
        for body in (b"data: 1\n\n", b"data: 2\n\n", b""):
            await send({"type": "http.response.body", "body": body, "more_body": bool(body)})

    app = stamp_arrival(handler, metrics)
    asyncio.run(app({"type": "http", "method": "POST"}, None, send))
    asyncio.run(app({"type": "http", "method": "GET"}, None, send))  # a scrape: not a stage
    assert len(sent) == 8  # every message still reaches the server
    assert sample(metrics, "first_byte", "count") == 1
    assert 0.002 <= sample(metrics, "first_byte", "sum") < 1.0
