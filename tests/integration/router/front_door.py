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
from services._proto import decode_pb2_grpc, prefill_pb2, prefill_pb2_grpc
from services.launcher import DEFAULT_CONFIG
from services.router.__main__ import build_core
from services.router.app import FrontDoor, create_app
from services.router.orchestrator import Orchestrator
from services.router.router_core import RouterCore


class Prefill(prefill_pb2_grpc.PrefillServicer):
    """Answers every prefill with first token 65 (the KV handle is not looked at by the fakes)."""

    async def Prefill(self, request, context):
        return prefill_pb2.PrefillReply(first_token=65, prefill_sim_s=0.01)


@asynccontextmanager
async def front_door(
    decode: Callable[[RouterCore], decode_pb2_grpc.DecodeServicer],
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
