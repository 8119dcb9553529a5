"""Simulated-clock headers of a response."""

from __future__ import annotations

from services.router.orchestrator import Trip
from services.router.sim_headers import sim_headers


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
