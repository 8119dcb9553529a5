"""What a response tells an outside load client about the twin's clock, in HTTP headers.

A client (AIPerf, guidellm, `vllm bench serve`) measures wall time; the twin's latencies are
simulated seconds and wall = simulated x time_scale (+ the front door's own overhead, + pacing
lag when this machine could not keep up). The headers give the simulated figures beside the wall
ones so a client's log can be read either way: `x-rackserve-sim-ttft-s` on every response (a
stream sends its headers with the first token), `x-rackserve-sim-tpot-s` and `-e2e-s` on
non-streamed ones (a stream's come in its last chunk's `rackserve` object).
"""

from __future__ import annotations

from services.router.orchestrator import Trip

TIME_SCALE = "x-rackserve-time-scale"
SIM_TTFT = "x-rackserve-sim-ttft-s"
SIM_TPOT = "x-rackserve-sim-tpot-s"
SIM_E2E = "x-rackserve-sim-e2e-s"
PACING_LAG = "x-rackserve-pacing-lag-s"


def sim_headers(trip: Trip, time_scale: float, done: bool) -> dict[str, str]:
    """Headers for a response whose first token (and, when `done`, last token) is known."""
    headers = {TIME_SCALE: f"{time_scale:g}", PACING_LAG: f"{trip.pacing_lag_s:.6f}"}
    if trip.token_times_s:
        headers[SIM_TTFT] = f"{trip.ttft_s:.6f}"
    if done and trip.token_times_s:
        headers[SIM_TPOT] = f"{trip.tpot_s:.6f}"
        headers[SIM_E2E] = f"{trip.e2e_s:.6f}"
    return headers
