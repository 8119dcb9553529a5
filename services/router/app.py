"""The OpenAI-compatible HTTP front door: completions and chat completions, streamed as SSE or not.

Handlers validate, tokenize and hand the request to the Orchestrator; every latency they report
is in simulated seconds (the `rackserve` field of a response, or of the last stream chunk).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from rackserve.metrics import ProcessMetrics, RequestRecord
from rackserve.model import tokenizer
from services.router.detok import Detokenizer
from services.router.openai_models import (
    ChatCompletionRequest,
    CompletionRequest,
    PromptTokensDetails,
    Timings,
    Usage,
    error_body,
    new_id,
    now,
)
from services.router.orchestrator import Orchestrator, Sampling, Trip

DEFAULT_CHAT_MAX_TOKENS = 256  # OpenAI's is "until the context ends"; bounded for a byte model
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's legacy default


class BadRequest(Exception):
    def __init__(
        self, message: str, param: str | None = None, code: str | None = None, status: int = 400
    ):
        super().__init__(message)
        self.param, self.code, self.status = param, code, status


@dataclass
class FrontDoor:
    """What the handlers need, built once at startup."""

    orchestrator: Orchestrator
    metrics: ProcessMetrics
    model_id: str
    max_context: int
    ready: Callable[[], bool]
    merge_metrics: Callable[[bytes], Awaitable[bytes]] | None = None


@dataclass(frozen=True)
class Prepared:
    prompt: list[int]
    sampling: Sampling
    stops: list[str]


def create_app(door: FrontDoor) -> FastAPI:
    app = FastAPI(title="rackserve", docs_url=None, redoc_url=None)
    _install_errors(app)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> Response:
        ok = door.ready()
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        body = door.metrics.exposition()
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

    @app.get("/admin/ranks", include_in_schema=False)
    async def ranks() -> dict:
        """Every rank's routing health: out while a probe, a failure or a drain holds it out."""
        return {"ranks": door.orchestrator.router.rank_health()}

    @app.get("/v1/rackserve/info")
    async def info() -> dict:
        """The twin's clock for clients (`rackserve bench`): wall seconds per simulated second."""
        scale = door.metrics.registry.get_sample_value("rackserve_time_scale") or 0.0
        return {"model": door.model_id, "time_scale": scale, "max_context": door.max_context}

    @app.get("/v1/models")
    async def models() -> dict:
        card = {
            "id": door.model_id,
            "object": "model",
            "created": 0,
            "owned_by": "rackserve",
            "max_model_len": door.max_context,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> Response:
        prompt = body.prompt if isinstance(body.prompt, list) else tokenizer.encode(body.prompt)
        prep = _prepare(door, body, prompt, DEFAULT_COMPLETION_MAX_TOKENS)
        echo = tokenizer.decode(prompt) if body.echo else ""
        shape = _Shape("text_completion", door.model_id, chat=False, echo=echo)
        return await _serve(door, body, prep, shape)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest) -> Response:
        messages = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            for m in body.messages
        ]
        try:
            prompt = tokenizer.apply_chat_template(messages)
        except ValueError as exc:
            raise BadRequest(str(exc), "messages") from None
        prep = _prepare(door, body, prompt, DEFAULT_CHAT_MAX_TOKENS)
        return await _serve(door, body, prep, _Shape("chat.completion", door.model_id, chat=True))

    return app


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
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        param = ".".join(loc) or None
        if first.get("type") == "json_invalid":
            message, param = "request body is not valid JSON", None
        elif first.get("type") == "extra_forbidden":
            message = f"Unrecognized request argument supplied: {param}"
        else:
            message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
        return JSONResponse(error_body(message, param), status_code=400)

    @app.exception_handler(BadRequest)
    async def bad(_: Request, exc: BadRequest) -> JSONResponse:
        return JSONResponse(error_body(str(exc), exc.param, exc.code), status_code=exc.status)

    @app.exception_handler(grpc.aio.AioRpcError)
    async def worker_failed(_: Request, exc: grpc.aio.AioRpcError) -> JSONResponse:
        if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:  # the worker named the bad field
            return JSONResponse(error_body(exc.details() or "invalid request"), status_code=400)
        return JSONResponse(
            error_body(f"worker unavailable: {exc.code().name}", kind="server_error"),
            status_code=503,
        )

    @app.exception_handler(StarletteHTTPException)
    async def http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), kind=kind), status_code=exc.status_code)


def _prepare(
    door: FrontDoor,
    body: CompletionRequest | ChatCompletionRequest,
    prompt: list[int],
    default_max: int,
) -> Prepared:
    if body.model != door.model_id:
        raise BadRequest(
            f"The model `{body.model}` does not exist.", "model", "model_not_found", 404
        )
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
    seed = body.seed % 2**64 if body.seed is not None else 0  # int64 seeds -> the uint64 field
    sampling = Sampling(max_tokens, body.temperature, body.top_p, seed, body.ignore_eos)
    return Prepared(prompt, sampling, body.stop_strings())


@dataclass(frozen=True)
class _Shape:
    """How to dress text as an OpenAI object (completion vs chat, echo)."""

    obj: str
    model: str
    chat: bool
    echo: str = ""

    def choice(self, text: str, finish: str | None) -> dict:
        if self.chat:
            return {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
                "logprobs": None,
            }
        return {"index": 0, "text": self.echo + text, "finish_reason": finish, "logprobs": None}

    def delta(self, text: str, finish: str | None, first: bool) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            return {
                "index": 0,
                "delta": delta if text or first else {},
                "finish_reason": finish,
                "logprobs": None,
            }
        return {
            "index": 0,
            "text": (self.echo if first else "") + text,
            "finish_reason": finish,
            "logprobs": None,
        }


def _usage(trip: Trip) -> dict:
    return Usage(
        prompt_tokens=trip.prompt_tokens,
        completion_tokens=trip.completion_tokens,
        total_tokens=trip.prompt_tokens + trip.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=trip.cached_tokens),
    ).model_dump()


def _timings(trip: Trip) -> dict:
    return Timings(
        ttft_s=trip.ttft_s,
        queue_s=trip.queue_s,
        prefill_s=trip.prefill_s,
        kv_transfer_s=trip.kv_transfer_s,
        first_decode_s=trip.first_decode_s,
        e2e_s=trip.e2e_s,
        tpot_s=trip.tpot_s,
        prefill=trip.prefill,
        decode=trip.decode,
        local_hit_tokens=trip.local_hit_tokens,
        pool_hit_tokens=trip.pool_hit_tokens,
        pacing_lag_s=trip.pacing_lag_s,
    ).model_dump()


async def _run(
    door: FrontDoor, trip: Trip, prep: Prepared
) -> AsyncIterator[tuple[str, str | None]]:
    """Yield (text delta, finish_reason or None) until the request ends."""
    detok = Detokenizer(prep.stops)
    gen = door.orchestrator.generate(trip, prep.prompt, prep.sampling)
    try:
        async for tokens in gen:
            text = detok.push(tokens)
            if detok.stopped:
                yield text, "stop"
                return
            if text:
                yield text, None
        yield detok.flush(), trip.finish_reason or "length"
    finally:
        await gen.aclose()


def _record(door: FrontDoor, trip: Trip, status: str) -> None:
    times = trip.token_times_s
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
            decode_engine=trip.decode,
        )
    )


async def _serve(
    door: FrontDoor, body: CompletionRequest | ChatCompletionRequest, prep: Prepared, shape: _Shape
) -> Response:
    rid = new_id("chatcmpl" if shape.chat else "cmpl")
    trip = Trip(rid, len(prep.prompt))
    if body.stream:
        usage = body.stream_options is not None and body.stream_options.include_usage
        return StreamingResponse(
            _sse(door, trip, prep, shape, usage), media_type="text/event-stream"
        )
    door.metrics.front_door.in_flight.inc()
    status = "error"
    try:
        parts = [(text, finish) async for text, finish in _run(door, trip, prep)]
        status = "finished"
    finally:
        door.metrics.front_door.in_flight.dec()
        _record(door, trip, status)
    text = "".join(t for t, _ in parts)
    choice = shape.choice(text, parts[-1][1])
    if body.return_token_ids:
        choice["token_ids"] = trip.output_ids
    return JSONResponse(
        {
            "id": rid,
            "object": shape.obj,
            "created": now(),
            "model": shape.model,
            "choices": [choice],
            "usage": _usage(trip),
            "rackserve": _timings(trip),
        }
    )


async def _sse(
    door: FrontDoor, trip: Trip, prep: Prepared, shape: _Shape, include_usage: bool
) -> AsyncIterator[bytes]:
    obj = shape.obj + ".chunk" if shape.chat else shape.obj
    head = {"id": trip.request_id, "object": obj, "created": now(), "model": shape.model}
    door.metrics.front_door.in_flight.inc()
    status, first = "aborted", True
    try:
        async for text, finish in _run(door, trip, prep):
            chunk = {**head, "choices": [shape.delta(text, finish, first)]}
            if finish is not None:
                chunk["rackserve"] = _timings(trip)
            first = False
            yield _event(chunk)
        if include_usage:
            yield _event({**head, "choices": [], "usage": _usage(trip)})
        status = "finished"
        yield b"data: [DONE]\n\n"
    except Exception as exc:  # the stream has started: report in-band, as OpenAI does
        status = "error"
        yield _event(error_body(f"internal error: {exc}", kind="server_error"))
    finally:
        door.metrics.front_door.in_flight.dec()
        _record(door, trip, status)


def _event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
