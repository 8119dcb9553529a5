"""A rank whose queue is full answers RESOURCE_EXHAUSTED; the front door turns it into HTTP 429 with
Retry-After (not a 503, and no migration to another rank): admission pushes back end to end.

Real gRPC and HTTP: the router's own app and orchestrator, and a gRPC Prefill server that answers
as a prefill service does when its rank actor raises QueueFull (services/prefill/service.py)."""

from __future__ import annotations

import grpc
import httpx

from rackserve.config import load_config
from rackserve.metrics import ProcessMetrics
from rackserve.timing import TimingModel
from services._proto import prefill_pb2_grpc
from services.launcher import DEFAULT_CONFIG
from services.router.__main__ import build_core
from services.router.app import FrontDoor, create_app
from services.router.orchestrator import Orchestrator


class FullRank(prefill_pb2_grpc.PrefillServicer):
    def __init__(self) -> None:
        self.calls = 0

    async def Prefill(self, request, context):
        self.calls += 1
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rank queue full: 4096 requests admitted")


async def test_full_rank_queue_is_429_with_retry_after():
    rank = FullRank()
    server = grpc.aio.server()
    prefill_pb2_grpc.add_PrefillServicer_to_server(rank, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        cfg = load_config(DEFAULT_CONFIG)
        metrics = ProcessMetrics(cfg.engine.model_id)
        core = build_core(cfg, TimingModel.from_section(cfg.timing), metrics)
        addr = f"127.0.0.1:{port}"
        orch = Orchestrator(core, addr, addr, cfg.engine.model_id, cfg.engine.block_size, 10.0, 10.0)
        door = FrontDoor(orch, metrics, cfg.engine.model_id, cfg.engine.max_context, ready=lambda: True)
        transport = httpx.ASGITransport(app=create_app(door))
        async with httpx.AsyncClient(transport=transport, base_url="http://front-door") as client:
            body = {"model": cfg.engine.model_id, "prompt": "hello rack", "max_tokens": 4}
            reply = await client.post("/v1/completions", json=body)
    finally:
        await server.stop(0)
    assert reply.status_code == 429, reply.text
    assert int(reply.headers["retry-after"]) >= 1
    assert "queue full" in reply.json()["error"]["message"]
    assert rank.calls == 1  # pushed back, not migrated to another rank
