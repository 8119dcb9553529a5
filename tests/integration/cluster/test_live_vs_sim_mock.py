"""Live vs simulator under open-loop load, on mock ranks (issue 35 item 3, at CI scale).

scenarios/local.yaml served with `--engine mock` (the ranks keep the scheduler, hashing, rank
caches, pool and pacing and emit seeded pseudo-tokens), a seeded multi-turn workload sent open
loop at its Poisson arrivals, then `rackserve sim` on the arrivals the live run recorded
(services/bench/live_vs_sim.py, the same code as the rack-scale benchmark bench/simulator/live_vs_sim.py).
Unlike test_sim_agreement (one request at a time, the real model), requests here overlap: prefill
batches, decode batches and queues form on both sides, so TPOT and queueing are compared too.

Live latencies are the client's wall clock / time_scale. Tolerances (why), from the first runs:
- no request fails on the live side and the simulator completes them all;
- hit rate within 0.08 absolute: both sides route with the same policy code on the same block
  hashes. Measured: live 0.739 (= the ideal of this workload), sim 0.708 before issue 48, 0.663 since
  (every step now pays the fitted 1.56 ms of host work, so prefill steps are longer and more requests
  arrive while their prefix is still being computed; the tolerance was 0.05). The sim's misses are
  requests that reach the other rank of the DEP2 instance while the request holding their prefix
  is still prefilling: the next lockstep step starts at the very instant the prefix's pool put is
  issued, and the sim prices the put (setup + bytes) and the KV event lag, so the prefix is not
  yet visible; live, the step starts after ~1 ms of wall-clock bookkeeping (0.02 ms simulated at
  this time_scale), by when Redis holds it. Dropping the pool or routing breaks either side by
  far more (the sim's hit rate must also be most of the ideal);
- TTFT and TPOT P50 within 25%: the live side adds HTTP, gRPC, Ray and pacing lag that the
  simulator does not price (measured in the closing note of issue 35); 25% is the project's
  credibility goal and still fails on a missing MTP speed-up (~2x TPOT) or a dropped queue.
"""

from __future__ import annotations

import pytest

from rackserve.config import load_config
from rackserve.kv.block_hash import block_hashes
from rackserve.sim.metrics import ideal_hit_rate
from rackserve.workload.request import Request
from services.bench.live_vs_sim import Shape, compare, plan, table
from services.launcher import DEFAULT_CONFIG
from services.redis_server import free_port
from tests.e2e.launcher_proc import LauncherProcess, launcher_command

pytestmark = pytest.mark.integration

TIME_SCALE = "50"  # wall s per simulated s: slow enough that a loaded 2-core machine keeps pace
SHAPE = Shape(sessions=6, turns=3, rate=200.0, output_tokens=12)


def requests() -> list[Request]:
    return [Request(k, p.arrival_s, len(p.prompt), SHAPE.output_tokens,
                    tuple(block_hashes(p.prompt, 16, "rackserve-moe-small")), p.session, p.turn)
            for k, p in enumerate(plan(SHAPE))]


@pytest.fixture(scope="module", params=["actor", "service"])
def mock_cluster(request):
    """Mock ranks in one Ray actor per instance, and in the worker services' own processes
    (engine.mock_ranks): the same answers either way."""
    env = {"RACKSERVE_CLUSTER__TIME_SCALE": TIME_SCALE, "RACKSERVE_ENGINE__KIND": "mock",
           "RACKSERVE_ENGINE__MOCK_RANKS": request.param}
    proc = LauncherProcess(launcher_command("--port", str(free_port()), "--engine", "mock"), env=env)
    proc.start(timeout_s=240)
    yield proc
    proc.stop()


def test_live_mock_cluster_agrees_with_the_simulator_under_load(mock_cluster, monkeypatch):
    monkeypatch.setenv("RACKSERVE_ENGINE__KIND", "mock")
    result = compare(mock_cluster.base_url, load_config(DEFAULT_CONFIG), SHAPE)
    print(table(result))
    assert result["failed"] == 0, result["errors"]
    assert result["sim_completed"] == result["requests"] and result["sim_rejected"] == 0
    row = {r["metric"]: r for r in result["rows"]}
    assert row["hit_rate"]["sim"] > 0.8 * ideal_hit_rate(requests(), 16)  # most of what could hit
    assert abs(row["hit_rate"]["live"] - row["hit_rate"]["sim"]) <= 0.08
    for metric in ("ttft_p50_ms", "tpot_p50_ms"):
        assert abs(row[metric]["rel_err"]) <= 0.25, (metric, row[metric])
