"""The OpenAI-compatible HTTP front door: completions and chat completions, streamed as SSE or not.

Handlers validate, tokenize and hand the request to the Orchestrator; every latency they report
is in simulated seconds (the `rackserve` field of a response, or of the last stream chunk).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from rackserve.metrics import ProcessMetrics, RequestRecord
from rackserve.model import tokenizer
from rackserve.routing.view import NoRankAvailable
from services.router import choices
from services.router.admission import RETRY_AFTER_S
from services.router.choices import Piece, Prepared
from services.router.openai_models import (
    ChatCompletionRequest,
    CompletionRequest,
    error_body,
    new_id,
    now,
)
from services.router.orchestrator import Orchestrator, Sampling, Trip
from services.router.prompt_ids import BadRequest, chat_prompt, check_model, completion_prompt
from services.router.response_shape import Shape, timings_of, usage_of
from services.router.sim_headers import sim_headers
from services.router.sse_response import SSEResponse, dumps
from services.router.stream_errors import WorkerUnavailable, stream_error_message
from services.router.tokenize_routes import add_tokenize_routes
from services.router.validation_errors import validation_message
from services.stage_timer import arrived_s, observe

log = logging.getLogger(__name__)
VERSION = importlib.metadata.version("rackserve")

DEFAULT_CHAT_MAX_TOKENS = 256  # OpenAI's is "until the context ends"; bounded for a byte model
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's legacy default


@dataclass
class FrontDoor:
    """What the handlers need, built once at startup."""

    orchestrator: Orchestrator
    metrics: ProcessMetrics
    model_id: str
    max_context: int
    ready: Callable[[], bool]
    merge_metrics: Callable[[bytes], Awaitable[bytes]] | None = None
    instance_id: str = ""  # the launcher's id for this cluster, echoed by /ready
    waiting_for: Callable[[], list[str]] = list  # why not ready (services/router/readiness.py)
    # (instance, rank) -> node, pid, state, last step: from the workers' Health replies
    worker_ranks: dict[tuple[str, int], dict] = field(default_factory=dict)
    planner: Any = None  # services/router/planner_loop.LivePlanner when the config has a planner


def create_app(door: FrontDoor) -> FastAPI:
    app = FastAPI(title="rackserve", docs_url=None, redoc_url=None)
    _install_errors(app)

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": VERSION}

    @app.get("/ready")
    async def ready() -> Response:
        ok = door.ready()
        body = {"ready": ok, "instance": door.instance_id}
        if not ok:
            body["waiting_for"] = door.waiting_for()
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        # Off the event loop (the registry is thread-safe): a scrape every second must not stall
        # the requests in flight.
        body = await asyncio.to_thread(door.metrics.exposition)
        if door.merge_metrics is not None:
            body = await door.merge_metrics(body)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/admin/drain", include_in_schema=False)
    async def drain_instance(instance: str) -> dict:
        """No new work to `instance`; its running requests finish (`running` counts them)."""
        return _drain(door, instance, True)

    @app.get("/admin/drain", include_in_schema=False)
    async def drain_state(instance: str) -> dict:
        return _drain(door, instance, None)

    @app.delete("/admin/drain", include_in_schema=False)
    async def undrain_instance(instance: str) -> dict:
        return _drain(door, instance, False)

    @app.get("/admin/planner", include_in_schema=False)
    async def planner() -> dict:
        """The planner's fleet, targets, decisions and SLA so far (404 without a planner)."""
        if door.planner is None:
            raise BadRequest("planner: this cluster's config has no planner section", "planner", status=404)
        return door.planner.state()

    @app.get("/admin/ranks", include_in_schema=False)
    async def ranks() -> dict:
        """Every rank's routing health (out while a probe, a failure or a drain holds it out)
        and, from its worker, its node, PID, state and last step."""
        ranks = door.orchestrator.router.rank_health()
        return {"ranks": [{**r, **door.worker_ranks.get((r["instance"], r["rank"]), {})} for r in ranks]}

    @app.get("/v1/rackserve/info")
    async def info() -> dict:
        """The twin's clock for clients (`rackserve bench`): wall seconds per simulated second."""
        return {
            "model": door.model_id,
            "time_scale": _time_scale(door),
            "max_context": door.max_context,
        }

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [_model_card(door)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict:
        check_model(door.model_id, model_id)
        return _model_card(door)

    add_tokenize_routes(app, door)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> Response:
        prompt = completion_prompt(body.prompt)
        prep = _prepare(door, body, prompt, DEFAULT_COMPLETION_MAX_TOKENS)
        echo = tokenizer.decode(prompt) if body.echo else ""
        shape = Shape("text_completion", door.model_id, chat=False, echo=echo)
        return await _serve(door, body, prep, shape)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest) -> Response:
        prompt = chat_prompt(body.messages, body.add_generation_prompt)
        prep = _prepare(door, body, prompt, DEFAULT_CHAT_MAX_TOKENS)
        return await _serve(door, body, prep, Shape("chat.completion", door.model_id, chat=True))

    return app


def _model_card(door: FrontDoor) -> dict:
    """The served model as OpenAI's (and vLLM's) model object. No server path: a client finds the
    tokenizer with `rackserve tokenizer-path` (the same files on every machine)."""
    return {
        "id": door.model_id,
        "object": "model",
        "created": 0,
        "owned_by": "rackserve",
        "root": door.model_id,
        "parent": None,
        "max_model_len": door.max_context,
        "time_scale": _time_scale(door),
    }


def _time_scale(door: FrontDoor) -> float:
    return door.metrics.registry.get_sample_value("rackserve_time_scale") or 0.0


def _drain(door: FrontDoor, instance: str, draining: bool | None) -> dict:
    try:
        return door.orchestrator.router.drain(instance, draining)
    except KeyError:
        raise BadRequest(
            f"instance: no worker instance {instance!r}", "instance", status=404
        ) from None


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc.errors(), exc.body)
        return JSONResponse(error_body(message, param), status_code=400)

    @app.exception_handler(BadRequest)
    async def bad(_: Request, exc: BadRequest) -> JSONResponse:
        return JSONResponse(error_body(str(exc), exc.param, exc.code), status_code=exc.status)

    @app.exception_handler(grpc.aio.AioRpcError)
    async def worker_failed(_: Request, exc: grpc.aio.AioRpcError) -> JSONResponse:
        if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:  # the worker named the bad field
            return JSONResponse(error_body(exc.details() or "invalid request"), status_code=400)
        if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:  # a rank's queue is full: push back
            body = error_body(f"server busy: {exc.details()}", kind="rate_limit_exceeded")
            return JSONResponse(body, status_code=429, headers={"retry-after": str(RETRY_AFTER_S)})
        log.warning("worker call failed: %s %s", exc.code().name, exc.details())
        return _unavailable(stream_error_message(exc))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        body = error_body("internal server error (details in the router log)", kind="server_error")
        return JSONResponse(body, status_code=500)

    @app.exception_handler(WorkerUnavailable)
    async def unavailable(_: Request, exc: WorkerUnavailable) -> JSONResponse:
        """A worker failed past the migration budget, or every rank of a role is out (failed,
        restarting, drained): retryable, with the same message a stream gets in-band."""
        log.warning("request failed before its first token: %s", exc.__cause__ or exc)
        return _unavailable(exc.message)

    @app.exception_handler(NoRankAvailable)
    async def no_rank(_: Request, exc: NoRankAvailable) -> JSONResponse:
        return _unavailable(WorkerUnavailable.from_no_rank(exc).message)

    @app.exception_handler(StarletteHTTPException)
    async def http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), kind=kind), status_code=exc.status_code)


def _unavailable(message: str) -> JSONResponse:
    body = error_body(message, kind="server_error", code="unavailable")
    return JSONResponse(body, status_code=503, headers={"retry-after": str(RETRY_AFTER_S)})


def _prepare(
    door: FrontDoor,
    body: CompletionRequest | ChatCompletionRequest,
    prompt: list[int],
    default_max: int,
) -> Prepared:
    check_model(door.model_id, body.model)
    if any(t >= tokenizer.VOCAB_SIZE for t in prompt):
        raise BadRequest(f"prompt: token ids must be below {tokenizer.VOCAB_SIZE}", "prompt")
    room = door.max_context - len(prompt)
    if room < 1:
        raise BadRequest(
            f"This model's maximum context length is {door.max_context} tokens; "
            f"the prompt has {len(prompt)} tokens.",
            "messages" if not hasattr(body, "prompt") else "prompt",
            "context_length_exceeded",
        )
    max_tokens = body.max_tokens if body.max_tokens is not None else min(default_max, room)
    if len(prompt) + max_tokens > door.max_context:
        raise BadRequest(
            f"This model's maximum context length is {door.max_context} tokens; "
            f"{len(prompt)} prompt + {max_tokens} max_tokens exceed it.",
            "max_tokens",
            "context_length_exceeded",
        )
    if body.min_tokens > max_tokens:
        raise BadRequest(
            f"min_tokens: {body.min_tokens} must not exceed max_tokens ({max_tokens})", "min_tokens"
        )
    sampling = Sampling(
        max_tokens, body.temperature, body.top_p, _seed(body.seed), body.ignore_eos,
        body.top_logprobs_asked(), body.logit_bias_pairs(), body.min_tokens,
        body.frequency_penalty, body.presence_penalty, body.repetition_penalty or 1.0,
        body.prompt_logprobs_asked(),
    )
    return Prepared(prompt, sampling, body.stop_strings())


def _seed(asked: int | None) -> int:
    """The request's seed as the uint64 wire field; without one, a fresh one per request (so two
    unseeded sampled requests differ, as in OpenAI and vLLM), which its prefill and decode ranks
    and any migration then share."""
    if asked is None:
        return secrets.randbits(64)
    return asked % 2**64  # int64 seeds -> the uint64 field


def _record(door: FrontDoor, trip: Trip, status: str) -> None:
    times = trip.token_times_s
    if door.planner is not None and status == "finished" and times:
        door.planner.on_finish(trip.ttft_s, trip.tpot_s if len(times) > 1 else None)
    door.metrics.observe_request(
        RequestRecord(
            status=status,
            prompt_cached_tokens=trip.cached_tokens,
            prompt_uncached_tokens=trip.prompt_tokens - trip.cached_tokens,
            output_tokens=trip.completion_tokens,
            ttft_s=trip.ttft_s if times else None,
            queue_s=trip.queue_s,
            prefill_s=trip.prefill_s,
            kv_transfer_s=trip.kv_transfer_s,
            first_decode_s=trip.first_decode_s,
            e2e_s=trip.e2e_s if times else None,
            inter_token_s=[b - a for a, b in zip(times, times[1:], strict=False)],
            decode_engine=trip.last_decode,
            finish_reason=trip.finish_reason,
        )
    )


async def _serve(
    door: FrontDoor, body: CompletionRequest | ChatCompletionRequest, prep: Prepared, shape: Shape
) -> Response:
    rid = new_id("chatcmpl" if shape.chat else "cmpl")
    trips = choices.trips(rid, len(prep.prompt), body.n)
    if door.planner is not None:
        for _ in trips:
            door.planner.on_arrival(len(prep.prompt), prep.sampling.max_tokens)
    if (arrived := arrived_s()) is not None:
        observe(door.metrics, "http_in", arrived)
    if body.stream:
        return await _stream(door, body, rid, trips, prep, shape)
    door.metrics.front_door.in_flight.inc()
    try:
        pieces = await asyncio.gather(
            *(_complete(door, trip, choices.sampling_of(prep, i)) for i, trip in enumerate(trips))
        )
    finally:
        door.metrics.front_door.in_flight.dec()
    answers = [
        _choice(body, shape, trip, i, parts, _echoed(body, prep))
        for i, (trip, parts) in enumerate(zip(trips, pieces, strict=True))
    ]
    return JSONResponse(
        {
            "id": rid,
            "object": shape.obj,
            "created": now(),
            "model": shape.model,
            "choices": answers,
            "usage": usage_of(trips),
            "rackserve": timings_of(trips[0]),
        },
        headers=sim_headers(trips[0], _time_scale(door), done=True),
    )


async def _complete(door: FrontDoor, trip: Trip, prep: Prepared) -> list[Piece]:
    """One choice run to its end (recorded in the metrics however it ends)."""
    status = "error"
    try:
        parts = [piece async for piece in choices.run(door.orchestrator, trip, prep)]
        status = "finished"
        return parts
    finally:
        _record(door, trip, status)


def _echoed(body: CompletionRequest | ChatCompletionRequest, prep: Prepared) -> list[int]:
    """The prompt tokens whose logprobs lead the choice's (echo with logprobs), else none."""
    return prep.prompt if body.prompt_logprobs_asked() is not None else []


def _choice(
    body: CompletionRequest | ChatCompletionRequest, shape: Shape, trip: Trip, index: int,
    parts: list[Piece], echoed: list[int],
) -> dict:
    choice = shape.choice("".join(p.text for p in parts), parts[-1].finish)
    choice["index"] = index
    if body.top_logprobs_asked() is not None:
        end = parts[-1].end
        choice["logprobs"] = choices.logprobs_of(trip, 0, end, shape.chat, len(shape.echo), echoed)
    if body.return_token_ids:
        choice["token_ids"] = trip.output_ids
    return choice


async def _stream(
    door: FrontDoor, body: CompletionRequest | ChatCompletionRequest, rid: str, trips: list[Trip],
    prep: Prepared, shape: Shape,
) -> Response:
    """Start the stream, then answer: the headers carry the simulated TTFT (known at the first
    token), and a failure before the first token is a plain HTTP error, not a 200."""
    options = body.stream_options
    events = _sse(
        door, body, rid, trips, prep, shape, options is not None and options.usage_last,
        options is not None and options.usage_every_chunk,
    )
    first = await anext(events)
    return SSEResponse(first, events, sim_headers(trips[0], _time_scale(door), done=False))


async def _sse(
    door: FrontDoor, body: CompletionRequest | ChatCompletionRequest, rid: str, trips: list[Trip],
    prep: Prepared, shape: Shape, include_usage: bool, every_chunk: bool,
) -> AsyncIterator[bytes]:
    obj = shape.obj + ".chunk" if shape.chat else shape.obj
    head = {"id": rid, "object": obj, "created": now(), "model": shape.model}
    door.metrics.front_door.in_flight.inc()
    streams = [
        _choice_chunks(door, body, trip, choices.sampling_of(prep, i), shape, i)
        for i, trip in enumerate(trips)
    ]
    first = True
    try:
        async for choice, trip in choices.merge(streams):
            chunk = {**head, "choices": [choice]}
            if every_chunk:  # vLLM's continuous_usage_stats: the usage so far
                chunk["usage"] = usage_of(trips, details=False)
            if choice["finish_reason"] is not None:
                chunk["rackserve"] = timings_of(trip)
            if first and (arrived := arrived_s()) is not None:
                observe(door.metrics, "front_door_ttft", arrived)
            first = False
            yield _event(chunk)
        if include_usage:
            yield _event({**head, "choices": [], "usage": usage_of(trips)})
        yield b"data: [DONE]\n\n"
    except Exception as exc:
        if first:  # nothing sent yet: the handler answers with an HTTP error
            raise
        # The stream has started: report in-band, as OpenAI does, with a short stable message;
        # the details go to the log.
        if isinstance(exc, WorkerUnavailable):  # expected (a worker died): no traceback
            log.warning("request %s failed mid-stream: %s", rid, exc.__cause__ or exc)
        else:
            log.warning("request %s failed mid-stream", rid, exc_info=exc)
        yield _event(error_body(stream_error_message(exc), kind="server_error"))
    finally:
        door.metrics.front_door.in_flight.dec()


async def _choice_chunks(
    door: FrontDoor, body: CompletionRequest | ChatCompletionRequest, trip: Trip, prep: Prepared,
    shape: Shape, index: int,
) -> AsyncIterator[tuple[dict, Trip]]:
    """One choice's stream deltas (with their tokens' logprobs when asked), recorded in the
    metrics however it ends."""
    status, first = "aborted", True
    try:
        async for piece in choices.run(door.orchestrator, trip, prep):
            delta = shape.delta(piece.text, piece.finish, first)
            delta["index"] = index
            if body.top_logprobs_asked() is not None:
                offset, echoed = (len(shape.echo), _echoed(body, prep)) if first else (0, [])
                delta["logprobs"] = choices.logprobs_of(
                    trip, piece.start, piece.end, shape.chat, offset, echoed
                )
            first = False
            yield delta, trip
        status = "finished"
    except Exception:
        status = "error"
        raise
    finally:
        _record(door, trip, status)


def _event(payload: dict) -> bytes:
    return b"data: " + dumps(payload) + b"\n\n"
