"""The short, stable, retryable messages a client gets when a worker fails (docs/operating.md)."""

from __future__ import annotations

import grpc

from rackserve.routing.view import NoRankAvailable
from services.router.stream_errors import WorkerUnavailable, stream_error_message


def _rpc(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        code, grpc.aio.Metadata(), grpc.aio.Metadata(),
        details="failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1",
        debug_error_string="UNKNOWN:Error received from peer {grpc_status:14}",
    )


def test_no_rank_of_a_role_names_the_role_not_the_layout() -> None:
    exc = NoRankAvailable("decode_layout: no healthy decode rank of layout None", "decode")
    assert stream_error_message(exc) == "worker unavailable (decode); retry the request"
    prefill = NoRankAvailable("cluster: no healthy prefill rank", "prefill")
    assert stream_error_message(prefill) == "worker unavailable (prefill); retry the request"


def test_worker_failures_past_the_migration_budget() -> None:
    assert stream_error_message(WorkerUnavailable("decode")) == (
        "worker unavailable (decode); retry the request"
    )
    assert stream_error_message(WorkerUnavailable("decode", timed_out=True)) == (
        "worker timed out (decode); retry the request"
    )


def test_messages_carry_no_internals() -> None:
    message = stream_error_message(_rpc(grpc.StatusCode.UNAVAILABLE))
    assert message == "worker unavailable; retry the request"
    for internal in ("debug_error_string", "AioRpcError", "127.0.0.1", "peer", "UNAVAILABLE"):
        assert internal not in message
    assert stream_error_message(_rpc(grpc.StatusCode.RESOURCE_EXHAUSTED)) == (
        "server busy; retry the request"
    )
    assert stream_error_message(RuntimeError("boom at 0x7f")) == (
        "internal error; retry the request (details in the router log)"
    )
    assert stream_error_message(TimeoutError()) == "worker timed out; retry the request"
