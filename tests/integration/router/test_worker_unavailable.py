"""A decode service that dies (every decode rank out of routing) ends its requests with the
documented retryable message, `worker unavailable (decode); retry the request`: in-band once the
stream has started, as a 503 + Retry-After before the first token (no layout, no internals).

Real gRPC and HTTP: the router's own app and orchestrator, a gRPC Prefill server that answers,
and a gRPC Decode server that sends one chunk and then fails as a dead decode service does."""

from __future__ import annotations

import json

import grpc

from services._proto import decode_pb2, decode_pb2_grpc
from services.router.router_core import RouterCore
from tests.integration.router.front_door import front_door

MESSAGE = "worker unavailable (decode); retry the request"


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


async def test_dead_decode_service_mid_stream_is_the_documented_in_band_error():
    body = {"prompt": "hello rack", "max_tokens": 8, "stream": True}
    async with front_door(DyingDecode) as (client, _, model):
        async with client.stream("POST", "/v1/completions", json={**body, "model": model}) as reply:
            assert reply.status_code == 200
            events = [line[6:] async for line in reply.aiter_lines() if line.startswith("data: ")]
    errors = [json.loads(e)["error"] for e in events if e != "[DONE]" and "error" in json.loads(e)]
    assert [e["message"] for e in errors] == [MESSAGE], events
    assert errors[0]["type"] == "server_error"


async def test_no_decode_rank_before_the_first_token_is_a_503_without_internals():
    replies = []
    async with front_door(DyingDecode) as (client, core, model):
        take_out_every_decode_rank(core)
        for stream in (False, True):
            body = {"model": model, "prompt": "hello rack", "max_tokens": 8, "stream": stream}
            replies.append(await client.post("/v1/completions", json=body))
    for reply in replies:
        assert reply.status_code == 503, reply.text
        assert int(reply.headers["retry-after"]) >= 1
        assert reply.json()["error"]["message"] == MESSAGE
        assert "None" not in reply.text and "layout" not in reply.text
