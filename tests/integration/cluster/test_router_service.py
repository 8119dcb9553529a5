"""The gRPC Router: same policy as the front door, fed by the ranks' KV events through Redis."""

from __future__ import annotations

import time

import grpc
import httpx
import pytest

from rackserve.kv.block_hash import block_hashes
from rackserve.model import tokenizer
from services._proto import router_pb2, router_pb2_grpc

pytestmark = pytest.mark.integration

MODEL = "rackserve-moe-small"


def route(address: str, prompt: list[int]) -> router_pb2.RouteDecision:
    with grpc.insecure_channel(address) as channel:
        return router_pb2_grpc.RouterStub(channel).Route(
            router_pb2.RouteRequest(
                request_id="probe", token_ids=prompt, block_hashes=block_hashes(prompt, 16, MODEL)
            )
        )


def test_route_predicts_the_hit_after_a_prompt_was_served(live_cluster) -> None:
    address = live_cluster.urls["router (gRPC)"]
    prompt = tokenizer.encode("The router learns where blocks live from KV events. " * 3, bos=True)
    cold = route(address, prompt)
    assert cold.policy == "least-uncached-work"
    assert cold.prefill.instance == "prefill-dep2-0" and cold.prefill.rank in (0, 1)
    assert (cold.decode.instance, cold.decode.rank) in {
        ("decode-wide-ep-0", r) for r in range(4)
    } | {("decode-tp8-0", 0)}
    assert cold.predicted_hit_tokens == 0
    served = httpx.post(
        f"{live_cluster.base_url}/v1/completions",
        timeout=60,
        json={"model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0},
    ).json()
    deadline = time.monotonic() + 30
    warm = route(address, prompt)
    while warm.predicted_hit_tokens == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
        warm = route(address, prompt)
    full_blocks = (len(prompt) - 1) // 16
    assert warm.predicted_hit_tokens == 16 * full_blocks
    assert f"{warm.prefill.instance}/{warm.prefill.rank}" == served["rackserve"]["prefill"]
    with grpc.insecure_channel(address) as channel:  # the probe's booking goes: the ranks idle again
        stub = router_pb2_grpc.RouterStub(channel)
        assert stub.Release(router_pb2.ReleaseRouteRequest(request_id="probe")).released
        assert not stub.Release(router_pb2.ReleaseRouteRequest(request_id="probe")).released


def test_route_rejects_an_empty_prompt(live_cluster) -> None:
    with pytest.raises(grpc.RpcError) as err:
        route(live_cluster.urls["router (gRPC)"], [])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
