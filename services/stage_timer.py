"""Wall time of each hop of a request on its way to the first token, as the
`rackserve_frontdoor_stage_wall_seconds{stage}` histogram of the process that runs the hop.

The router observes http_in, route, prefill_call, decode_first_chunk, front_door_ttft and
first_byte; the
prefill service prefill_admit and prefill_wait; the decode service decode_admit and
decode_first_step; every instance loop its steps (prefill_step, decode_step: the Ray calls) and
each called rank's own time inside its actor (prefill_rank_step, decode_rank_step) and, of a call
that carried admissions, their share (prefill_rank_admit, decode_rank_admit). The front door's
/metrics merges the workers' series, so one scrape shows where a request's wall time went
(bench/frontdoor/overhead.py turns it into a table). Wall seconds, not simulated ones: this is the twin's
own overhead, which pacing hides when time_scale > 0.
"""

from __future__ import annotations

import time
from contextvars import ContextVar

from rackserve.metrics import ProcessMetrics
from services.router.asgi import ASGIApp, Receive, Scope, Send

# Every stage, in request order (one spelling each; the bench's table follows this order).
STAGES = (
    "http_in",  # ASGI arrival -> handler: body read, guards, validation, tokenize
    "route",  # block hashes + policy decision
    "prefill_call",  # the Prefill RPC as the router sees it
    "prefill_admit",  # prefill service: submitted -> admitted by the step call that carried it
    # (services/rank_inbox.py: Ray, pool lookup, enqueue and that step, with pool store, events)
    "prefill_wait",  # prefill service: admitted -> first token (later steps; ~0 for one step)
    "prefill_step",  # one prefill instance step (Ray calls of all its ranks, their compute)
    "prefill_rank_step",  # one rank's step inside its actor (engine, pool store, KV events)
    "prefill_rank_admit",  # of a step that admitted prompts: the admissions (pool lookup, enqueue)
    "decode_first_chunk",  # the Generate RPC until its first chunk, as the router sees it
    "decode_admit",  # decode service: submitted -> admitted by the step call that carried it
    # (Ray, pool fetch of the handle, that first step)
    "decode_first_step",  # decode service: admitted -> first step done (~0: the same call)
    "decode_step",  # one decode instance step
    "decode_rank_step",  # one rank's step inside its actor
    "decode_rank_admit",  # of a step that admitted requests: the hand-off's read and import
    "front_door_ttft",  # ASGI arrival -> first SSE event (streamed requests)
    "first_byte",  # ASGI arrival -> a POST's first response body bytes handed to the server
)

_ARRIVED_S: ContextVar[float | None] = ContextVar("rackserve_arrived_s", default=None)


def now_s() -> float:
    return time.perf_counter()


def observe(metrics: ProcessMetrics, stage: str, started_s: float) -> None:
    """One hop of `stage` that began at `started_s` (now_s()) ends now."""
    record(metrics, stage, now_s() - started_s)


def record(metrics: ProcessMetrics, stage: str, wall_s: float) -> None:
    """One hop of `stage` that took `wall_s` (timed elsewhere, e.g. inside a rank actor)."""
    metrics.stages.wall.labels(stage=stage).observe(wall_s)


def arrived_s() -> float | None:
    """When the HTTP request being handled reached the ASGI app (None outside a request)."""
    return _ARRIVED_S.get()


def stamp_arrival(app: ASGIApp, metrics: ProcessMetrics | None = None) -> ASGIApp:
    """Outermost ASGI layer: remembers each HTTP request's arrival for the handler's stages and,
    with `metrics`, observes first_byte when the response's first body bytes leave the app."""

    async def stamped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        arrived = now_s()
        _ARRIVED_S.set(arrived)
        if metrics is None or scope.get("method") != "POST":  # not /metrics, /health, ...
            await app(scope, receive, send)
            return
        pending = [True]

        async def timed_send(message: dict) -> None:
            await send(message)
            if pending and message["type"] == "http.response.body" and message.get("body"):
                pending.clear()
                observe(metrics, "first_byte", arrived)

        await app(scope, receive, timed_send)

    return stamped
