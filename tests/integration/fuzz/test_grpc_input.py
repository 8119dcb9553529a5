"""Malformed gRPC input to the live workers and router: INVALID_ARGUMENT naming the field, and
oversized messages refused (RESOURCE_EXHAUSTED) by the servers' explicit size limits."""

from __future__ import annotations

import grpc
import httpx
import pytest

from services._proto import (
    decode_pb2,
    decode_pb2_grpc,
    prefill_pb2,
    prefill_pb2_grpc,
    router_pb2,
    router_pb2_grpc,
)
from services.grpc_limits import MAX_MESSAGE_BYTES

pytestmark = pytest.mark.integration

BIG_CLIENT = [("grpc.max_send_message_length", 64 * 1024 * 1024)]


def _code_and_details(call, request) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        result = call(request, timeout=60)
        if not isinstance(result, prefill_pb2.PrefillReply | router_pb2.RouteDecision):
            list(result)  # a server stream: errors arrive on iteration
    return info.value.code(), info.value.details() or ""


def _instances(addr: str, stub) -> list[str]:
    with grpc.insecure_channel(addr) as channel:
        return list(stub(channel).Health(prefill_pb2.WorkerHealthRequest(), timeout=10).instances)


def test_prefill_bad_fields_are_invalid_argument(live_cluster) -> None:
    addr = live_cluster.urls["prefill (gRPC)"]
    instance = _instances(addr, prefill_pb2_grpc.PrefillStub)[0]
    cases = [
        (prefill_pb2.PrefillRequest(request_id="g1", instance="nope", token_ids=[1]), "instance"),
        (prefill_pb2.PrefillRequest(request_id="g2", instance=instance, token_ids=[]), "token_ids"),
        (
            prefill_pb2.PrefillRequest(
                request_id="g3", instance=instance, dp_rank=99, token_ids=[1]
            ),
            "rank",
        ),
    ]
    with grpc.insecure_channel(addr) as channel:
        stub = prefill_pb2_grpc.PrefillStub(channel)
        for request, field in cases:
            code, details = _code_and_details(stub.Prefill, request)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and field in details, details


def test_decode_bad_fields_are_invalid_argument(live_cluster) -> None:
    addr = live_cluster.urls["decode (gRPC)"]
    with grpc.insecure_channel(addr) as channel:
        stub = decode_pb2_grpc.DecodeStub(channel)
        request = decode_pb2.DecodeRequest(request_id="d1", instance="nope", token_ids=[1])
        code, details = _code_and_details(stub.Generate, request)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "instance" in details, details


def test_router_route_empty_prompt_is_invalid_argument(live_cluster) -> None:
    with grpc.insecure_channel(live_cluster.urls["router (gRPC)"]) as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        code, details = _code_and_details(stub.Route, router_pb2.RouteRequest(request_id="r"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "token_ids" in details


@pytest.mark.parametrize("service", ["prefill (gRPC)", "router (gRPC)"])
def test_oversized_message_is_refused(live_cluster, service: str) -> None:
    tokens = [1 << 28] * (MAX_MESSAGE_BYTES // 4)  # 5 bytes per varint: 1.25x the limit
    addr = live_cluster.urls[service]
    with grpc.insecure_channel(addr, options=BIG_CLIENT) as channel:
        if service.startswith("prefill"):
            call = prefill_pb2_grpc.PrefillStub(channel).Prefill
            request = prefill_pb2.PrefillRequest(request_id="big", instance="x", token_ids=tokens)
        else:
            call = router_pb2_grpc.RouterStub(channel).Route
            request = router_pb2.RouteRequest(request_id="big", token_ids=tokens)
        assert request.ByteSize() > MAX_MESSAGE_BYTES
        code, _ = _code_and_details(call, request)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_cluster_serves_after_malformed_grpc(live_cluster) -> None:
    body = {"model": "rackserve-moe-small", "prompt": "after", "max_tokens": 2, "temperature": 0}
    reply = httpx.post(f"{live_cluster.base_url}/v1/completions", json=body, timeout=60)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 2
