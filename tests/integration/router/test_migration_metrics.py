"""A request migrated off a failed decode rank keeps vLLM's meaning of the `engine` label (the
engine that served its last token, one series per engine) and is counted by
rackserve_migrations_total{from_role, to_role}, never spelled into a label value (issue 34)."""

from __future__ import annotations

import grpc
from prometheus_client.parser import text_string_to_metric_families

from services._proto import decode_pb2, decode_pb2_grpc
from services.router.router_core import RouterCore
from tests.integration.router.front_door import front_door


class FailsOnce(decode_pb2_grpc.DecodeServicer):
    """The first decode rank asked sends one token and fails; every later one serves."""

    def __init__(self, core: RouterCore) -> None:
        self.calls: list[str] = []

    async def Generate(self, request, context):
        self.calls.append(f"{request.instance}/{request.rank}")
        if len(self.calls) == 1:
            yield decode_pb2.TokenChunk(token_ids=[66], sim_time_s=0.001)
            await context.abort(grpc.StatusCode.INTERNAL, "rank actor died")
        owed = request.sampling.max_tokens - 1  # the first token came from the prefill
        yield decode_pb2.TokenChunk(token_ids=[67] * owed, sim_time_s=0.002, finish_reason="length")


async def test_migration_is_a_counter_not_an_engine_label():
    holder: list[FailsOnce] = []

    def decode(core: RouterCore) -> FailsOnce:
        holder.append(FailsOnce(core))
        return holder[0]

    async with front_door(decode) as (client, _, model):
        body = {"model": model, "prompt": "hello rack", "max_tokens": 6, "ignore_eos": True}
        reply = await client.post("/v1/completions", json=body)
        assert reply.status_code == 200, reply.text
        assert "->" in reply.json()["rackserve"]["decode"]  # the response keeps the path
        text = (await client.get("/metrics")).text
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    engines = {s.labels["engine"] for s in samples if s.name.startswith("vllm:e2e_request_latency")}
    assert engines == {holder[0].calls[-1]}, engines  # the engine of the last token, no path
    migrations = {
        (s.labels["from_role"], s.labels["to_role"]): s.value
        for s in samples if s.name == "rackserve_migrations_total"
    }
    assert migrations == {("decode", "decode"): 1.0, ("prefill", "prefill"): 0.0}  # 0 from the start
