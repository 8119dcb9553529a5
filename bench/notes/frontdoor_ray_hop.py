"""What one Ray hop into a rank actor costs on this machine, by transport (issue 19 item 2).

The front door's first token crosses one Ray actor call per step on each side; this measures, in
one run, the p50 wall time of a tiny call (a 64-int payload in, a small dataclass out) from an
asyncio driver:
- `actor_call`: `actor.step.remote(x)` awaited, as services/instance_loop.py does;
- `actor_call_rank_step`: the same with the real messages (a Submission in, a RankStep out);
- `compiled_graph`: the tiny call method in a Ray Compiled Graph (`ray.dag`, shared-memory channels,
  `experimental_compile(enable_asyncio=True)`), `await dag.execute_async(x)`.

    .venv/bin/python bench/notes/frontdoor_ray_hop.py [--calls 300]
(under flock /tmp/rackserve-ray.lock: it starts a local Ray) writes
bench/notes/frontdoor_ray_hop.json and prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import ray
from ray.dag import InputNode

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from rackserve.timing.batch import RankBatch  # noqa: E402
from services.rank_inbox import AdmitResult, Admitted, Submission  # noqa: E402
from services.rank_worker import Emitted, RankStep  # noqa: E402

RESULT = Path(__file__).parent / "frontdoor_ray_hop.json"


@dataclass(frozen=True)
class Answer:
    tokens: tuple[int, ...]
    wall_s: float


@ray.remote(num_cpus=0.1, max_concurrency=1)
class Rank:
    def step(self, inbox: tuple[int, ...]) -> Answer:
        return Answer(inbox[:4], 0.0)

    def rank_step(self, inbox: tuple[Submission, ...]) -> RankStep:
        """A prefill rank's real answer shape: one admission, one finished request's handle."""
        admitted = tuple(AdmitResult(s.request_id, Admitted(0, 0, 0)) for s in inbox)
        emitted = (Emitted("r", 7, "length", tuple(range(4)), Admitted(0, 0, 0), 1),)
        batch = RankBatch(np.asarray([64], np.int64), np.asarray([0], np.int64), 0, 0)
        return RankStep(batch, emitted, False, 4, 4096, admitted=admitted)


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def timed(call, n: int, payload: object = tuple(range(64))) -> dict:
    for _ in range(20):  # warm-up
        await call(payload)
    walls, cpu0 = [], cpu_s()
    for _ in range(n):
        t0 = time.perf_counter()
        await call(payload)
        walls.append(time.perf_counter() - t0)
    ms = sorted(1000 * w for w in walls)
    return {
        "p50_ms": statistics.median(ms),
        "p90_ms": ms[int(0.9 * (len(ms) - 1))],
        "driver_cpu_ms_per_call": 1000 * (cpu_s() - cpu0) / n,
    }


async def run(n: int) -> dict:
    rank = Rank.remote()

    async def actor_call(x):
        return await rank.step.remote(x)

    async def real_call(x):
        return await rank.rank_step.remote(x)

    inbox = (Submission("prefill", "r", tuple(range(64)), {"max_tokens": 16, "temperature": 0.0}),)
    out = {
        "actor_call": await timed(actor_call, n),
        "actor_call_rank_step": await timed(real_call, n, inbox),
    }
    other = Rank.remote()
    with InputNode() as inp:
        dag = other.step.bind(inp)
    compiled = dag.experimental_compile(enable_asyncio=True)
    try:

        async def graph_call(x):
            return await (await compiled.execute_async(x))

        out["compiled_graph"] = await timed(graph_call, n)
    finally:
        compiled.teardown()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", include_dashboard=False, log_to_driver=False, num_cpus=2)
    try:
        result = asyncio.run(run(args.calls))
    finally:
        ray.shutdown()
    result = {
        "command": "bench/notes/frontdoor_ray_hop.py " + " ".join(sys.argv[1:]),
        "ray": ray.__version__,
        "load_avg_1m": os.getloadavg()[0],
        "calls": args.calls,
        **result,
    }
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    for name in ("actor_call", "actor_call_rank_step", "compiled_graph"):
        r = result[name]
        print(f"{name:16s} p50 {r['p50_ms']:.3f} ms  p90 {r['p90_ms']:.3f} ms  "
              f"driver CPU {r['driver_cpu_ms_per_call']:.3f} ms/call")
    print(f"(load avg {result['load_avg_1m']:.1f}) -> {RESULT}")


if __name__ == "__main__":
    main()
