"""A decode service that dies (every decode rank out of routing) ends its requests with the
documented retryable message, `worker unavailable (decode); retry the request`: in-band once the
stream has started, as a 503 + Retry-After before the first token (no layout, no internals).

Real gRPC and HTTP: the router's own app and orchestrator, a gRPC Prefill server that answers,
and a gRPC Decode server that sends one chunk and then fails as a dead decode service does."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager

import grpc
import httpx

from rackserve.config import load_config
from rackserve.metrics import ProcessMetrics
from rackserve.timing import TimingModel
from services._proto import decode_pb2, decode_pb2_grpc, prefill_pb2, prefill_pb2_grpc
from services.launcher import DEFAULT_CONFIG
from services.router.__main__ import build_core
from services.router.app import FrontDoor, create_app
from services.router.orchestrator import Orchestrator
from services.router.router_core import RouterCore

MESSAGE = "worker unavailable (decode); retry the request"


class Prefill(prefill_pb2_grpc.PrefillServicer):
    async def Prefill(self, request, context):
        return prefill_pb2.PrefillReply(first_token=65, prefill_sim_s=0.01)


class DyingDecode(decode_pb2_grpc.DecodeServicer):
    """One chunk, then the decode service is gone: the router's probe takes every decode rank
    out of routing and the stream breaks."""

    def __init__(self, core: RouterCore) -> None:
        self.core = core

    async def Generate(self, request, context):
        yield decode_pb2.TokenChunk(token_ids=[66], sim_time_s=0.001)
        take_out_every_decode_rank(self.core)
        await context.abort(grpc.StatusCode.UNAVAILABLE, "Socket closed")


def take_out_every_decode_rank(core: RouterCore) -> None:
    for rank in core.rank_health():
        if rank["role"] == "decode":
            core.mark_health(rank["instance"], rank["rank"], healthy=False, reason="probe")


@asynccontextmanager
async def front_door():
    """(HTTP client of the front door, its RouterCore, the model id)."""
    cfg = load_config(DEFAULT_CONFIG)
    metrics = ProcessMetrics(cfg.engine.model_id)
    core = build_core(cfg, TimingModel.from_section(cfg.timing), metrics)
    server = grpc.aio.server()
    prefill_pb2_grpc.add_PrefillServicer_to_server(Prefill(), server)
    decode_pb2_grpc.add_DecodeServicer_to_server(DyingDecode(core), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    addr = f"127.0.0.1:{port}"
    orch = Orchestrator(core, addr, addr, cfg.engine.model_id, cfg.engine.block_size, 10.0, 10.0)
    door = FrontDoor(orch, metrics, cfg.engine.model_id, cfg.engine.max_context, ready=lambda: True)
    transport = httpx.ASGITransport(app=create_app(door))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://front-door") as client:
            yield client, core, cfg.engine.model_id
    finally:
        await orch.close()
        await server.stop(0)


async def test_dead_decode_service_mid_stream_is_the_documented_in_band_error():
    body = {"prompt": "hello rack", "max_tokens": 8, "stream": True}
    async with front_door() as (client, _, model):
        async with client.stream("POST", "/v1/completions", json={**body, "model": model}) as reply:
            assert reply.status_code == 200
            events = [line[6:] async for line in reply.aiter_lines() if line.startswith("data: ")]
    errors = [json.loads(e)["error"] for e in events if e != "[DONE]" and "error" in json.loads(e)]
    assert [e["message"] for e in errors] == [MESSAGE], events
    assert errors[0]["type"] == "server_error"


async def test_no_decode_rank_before_the_first_token_is_a_503_without_internals():
    replies = []
    async with front_door() as (client, core, model):
        take_out_every_decode_rank(core)
        for stream in (False, True):
            body = {"model": model, "prompt": "hello rack", "max_tokens": 8, "stream": stream}
            replies.append(await client.post("/v1/completions", json=body))
    for reply in replies:
        assert reply.status_code == 503, reply.text
        assert int(reply.headers["retry-after"]) >= 1
        assert reply.json()["error"]["message"] == MESSAGE
        assert "None" not in reply.text and "layout" not in reply.text
