"""The router's own app and orchestrator over real gRPC, with worker servers given by a test
(shared by the router integration tests that need a worker to behave in one exact way)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
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

FIRST_TOKEN = 65
# The logprob the fakes give every token they send (with token 66 as the one alternative).
FAKE_LOGPROB = prefill_pb2.TokenLogprob(logprob=-0.5, top_ids=[66], top_logprobs=[-0.25])


class Prefill(prefill_pb2_grpc.PrefillServicer):
    """Answers every prefill with FIRST_TOKEN (the KV handle is not looked at by the fakes), and
    FAKE_LOGPROB for every prompt token after the first when the prompt's logprobs are asked."""

    async def Prefill(self, request, context):
        first = FAKE_LOGPROB if request.sampling.logprobs else None
        prompt = [FAKE_LOGPROB] * (len(request.token_ids) - 1)
        return prefill_pb2.PrefillReply(
            first_token=FIRST_TOKEN, prefill_sim_s=0.01, first_logprob=first,
            prompt_logprobs=prompt if request.sampling.HasField("prompt_logprobs") else [],
        )


class Decode(decode_pb2_grpc.DecodeServicer):
    """Sends the prefill's token, then one token a chunk: 'B', 'C', ... (when sampling, by seed:
    'b', 'c', ... for an odd seed, so sampled choices differ), each with FAKE_LOGPROB when asked."""

    async def Generate(self, request, context):
        yield decode_pb2.TokenChunk(token_ids=[request.first_token], sim_time_s=0.001)
        sampled = request.sampling.temperature > 0
        base = ord("b") if sampled and request.sampling.seed % 2 else ord("B")
        owed = request.sampling.max_tokens - 1
        for i in range(owed):
            yield decode_pb2.TokenChunk(
                token_ids=[base + i % 26],
                sim_time_s=0.002 * (i + 2),
                finish_reason="length" if i == owed - 1 else "",
                logprobs=[FAKE_LOGPROB] if request.sampling.logprobs else [],
            )


@asynccontextmanager
async def front_door(
    decode: Callable[[RouterCore], decode_pb2_grpc.DecodeServicer] = lambda core: Decode(),
) -> AsyncIterator[tuple[httpx.AsyncClient, RouterCore, str]]:
    """(HTTP client of the front door, its RouterCore, the model id) over `decode(core)`."""
    cfg = load_config(DEFAULT_CONFIG)
    metrics = ProcessMetrics(cfg.engine.model_id)
    core = build_core(cfg, TimingModel.from_section(cfg.timing), metrics)
    server = grpc.aio.server()
    prefill_pb2_grpc.add_PrefillServicer_to_server(Prefill(), server)
    decode_pb2_grpc.add_DecodeServicer_to_server(decode(core), server)
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
