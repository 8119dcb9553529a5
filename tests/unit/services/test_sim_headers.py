"""Simulated-clock headers and the short, stable in-band stream errors."""

from __future__ import annotations

import grpc

from services.router.orchestrator import Trip
from services.router.sim_headers import sim_headers, stream_error_message


def test_headers_carry_simulated_latencies() -> None:
    trip = Trip("r", 10, queue_s=0.001, prefill_s=0.01, first_decode_s=0.002, pacing_lag_s=0.5)
    trip.token_times_s = [0.013, 0.016, 0.019]
    first = sim_headers(trip, 2.0, done=False)
    assert first == {"x-rackserve-time-scale": "2", "x-rackserve-pacing-lag-s": "0.500000",
                     "x-rackserve-sim-ttft-s": "0.013000"}
    last = sim_headers(trip, 2.0, done=True)
    assert last["x-rackserve-sim-tpot-s"] == "0.003000"
    assert last["x-rackserve-sim-e2e-s"] == "0.019000"


def test_no_ttft_before_a_token() -> None:
    assert "x-rackserve-sim-ttft-s" not in sim_headers(Trip("r", 3), 1.0, done=True)


def test_stream_errors_are_short_and_carry_no_internals() -> None:
    rpc = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
        details="failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1",
        debug_error_string="UNKNOWN:Error received from peer {grpc_status:14}",
    )
    message = stream_error_message(rpc)
    assert message == "worker unavailable (UNAVAILABLE); retry the request"
    for internal in ("debug_error_string", "AioRpcError", "127.0.0.1", "peer"):
        assert internal not in message
    assert stream_error_message(RuntimeError("boom at 0x7f")) == (
        "internal error; retry the request (details in the router log)"
    )
    assert stream_error_message(TimeoutError()) == "worker timed out; retry the request"
