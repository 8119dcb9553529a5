"""Where the prefill rank's step goes: bench/frontdoor/overhead.py's in-process reference (an engine stepping
prompts back to back) against the same prompts through a `RankWorker`, the plain class each rank
actor wraps, built in this process against a live cluster's Redis, KV pool and Engram shards, and
against the actor itself (the cluster's `prefill_rank_step` stage over streamed requests).

Variants, one object each, measured in rounds whose order reverses every round (ABCD DCBA), every
step on a prompt never seen before (a repeated prompt is served by the pool and computes nothing):
- engine: `add_request` then `step()` until done, back to back (the reference);
- engine, cache swept: the same with a 64 MiB memory sweep before each prompt (what the work between
  a rank's steps does to its weights in the 2 MiB L2);
- worker, local Engram: `RankWorker.step` (admission with the pool lookup, the engine step, the
  store with the pool commit, the KV events) with the in-process Engram table;
- worker, sharded Engram: the same with the cluster's Engram shards (its lookups are gRPC calls);
- worker, sharded Engram, a decode between: the same with another engine's 16-token decode before
  each prompt (not timed), as a request's decode runs between two prefills in the cluster.

    .venv/bin/python bench/notes/frontdoor_rank_step.py [--steps 15] [--rounds 6] [--requests 60]
writes bench/notes/frontdoor_rank_step.json and prints a table (p50 ms per step and, for the
workers, of its `Engine.step`).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # as Ray gives its actors
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
from bench.frontdoor import overhead as frontdoor  # noqa: E402  (bench/frontdoor/overhead.py: start_cluster, new_engine, prompt_text, cluster_latency: the same cluster, prompts and reference)
from rackserve.config import load_config  # noqa: E402
from rackserve.model import tokenizer  # noqa: E402
from rackserve.model.engine import Engine  # noqa: E402
from rackserve.model.sampling import SamplingParams  # noqa: E402
from services.launcher import DEFAULT_CONFIG  # noqa: E402
from services.rank_inbox import Submission  # noqa: E402
from services.rank_worker import RankWorker  # noqa: E402
from services.redis_server import free_port  # noqa: E402

RESULT = Path(__file__).parent / "frontdoor_rank_step.json"
SWEEP = np.ones(64 << 20, dtype=np.uint8)


class Variant:
    def __init__(self, name: str, step: Callable[[str], None], engine_times: list[float] | None = None,
                 before: Callable[[], object] | None = None) -> None:
        self.name, self.step, self.engine_times, self.before = name, step, engine_times, before
        self.times: list[float] = []


def run_prompt(engine: Engine, prompt: str, params: SamplingParams) -> None:
    """One prompt through an engine, stepped until it is done."""
    engine.add_request(prompt, tokenizer.encode(prompt), params)
    while engine.has_unfinished():
        engine.step()


def engine_variant(name: str, sweep: bool) -> Variant:
    engine = frontdoor.new_engine()
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)

    return Variant(name, lambda prompt: run_prompt(engine, prompt, params), before=SWEEP.sum if sweep else None)  # the sweep itself is not timed


def decode_between() -> Callable[[], None]:
    """What a request's decode does between two prefills in the cluster: 16 steps of another engine."""
    engine = frontdoor.new_engine()
    params = SamplingParams(max_tokens=frontdoor.OUTPUT_TOKENS, temperature=0.0, ignore_eos=True)
    fresh = itertools.count(90_000)

    return lambda: run_prompt(engine, frontdoor.prompt_text(next(fresh)), params)


def worker_variant(name: str, instance: str, addresses: dict[str, str], sharded: bool,
                   before: Callable[[], object] | None = None) -> Variant:
    cfg = load_config(DEFAULT_CONFIG)
    engram = addresses["engram shards"].split(",") if sharded else []
    worker = RankWorker(cfg, "prefill", instance, 0, addresses["redis"], addresses["kv pool (gRPC)"], engram)
    engine_times: list[float] = []
    inner = worker.engine.step

    def timed_engine_step():  # the engine's share of the worker's step
        t = time.perf_counter()
        out = inner()
        engine_times.append(time.perf_counter() - t)
        return out

    worker.engine.step = timed_engine_step  # type: ignore[method-assign]
    params = {"max_tokens": 1, "temperature": 0.0, "ignore_eos": True}

    def step(prompt: str) -> None:
        worker.step((Submission("prefill", prompt, tuple(tokenizer.encode(prompt)), params),))

    return Variant(name, step, engine_times, before)


def measure(variants: list[Variant], steps: int, rounds: int) -> None:
    fresh = itertools.count(50_000)  # bench/frontdoor/overhead.py's prompts are 0-40,000: never a pool hit
    for r in range(rounds + 1):  # round 0 warms every variant up and is not kept
        for v in variants if r % 2 == 0 else reversed(variants):
            for _ in range(steps):
                prompt = frontdoor.prompt_text(next(fresh))
                if v.before is not None:
                    v.before()
                t = time.perf_counter()
                v.step(prompt)
                if r:
                    v.times.append(time.perf_counter() - t)
                elif v.engine_times is not None:
                    v.engine_times.clear()


def fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}"


def p50_ms(values: list[float]) -> float:
    return 1000 * statistics.median(values)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=15, help="prompts per variant and round")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--requests", type=int, default=60, help="streamed requests for the actor's own figure")
    args = ap.parse_args()
    port = free_port()
    proc, addresses = frontdoor.start_cluster(port)
    try:
        variants = [engine_variant("engine, back to back", sweep=False),
                    engine_variant("engine, cache swept", sweep=True),
                    worker_variant("worker, local Engram", "bench-local", addresses, sharded=False),
                    worker_variant("worker, sharded Engram", "bench-sharded", addresses, sharded=True),
                    worker_variant("worker, sharded Engram, a decode between", "bench-decode", addresses,
                                   sharded=True, before=decode_between())]
        measure(variants, args.steps, args.rounds)
        actor = asyncio.run(frontdoor.cluster_latency(f"http://127.0.0.1:{port}", args.requests))["stages_wall_ms"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    rows = {v.name: {"steps": len(v.times), "step_p50_ms": p50_ms(v.times), "step_mean_ms": 1000 * statistics.fmean(v.times),
                     "engine_step_p50_ms": p50_ms(v.engine_times) if v.engine_times else None} for v in variants}
    rows["actor in the cluster (prefill_rank_step)"] = {
        "steps": actor.get("prefill_rank_step", {}).get("count", 0),
        "step_p50_ms": actor.get("prefill_rank_step", {}).get("p50_ms"),
        "step_mean_ms": actor.get("prefill_rank_step", {}).get("mean_ms"), "engine_step_p50_ms": None}
    result = {"command": "bench/notes/frontdoor_rank_step.py " + " ".join(sys.argv[1:]), "cpus": os.cpu_count(),
              "load_avg_1m": os.getloadavg()[0], "prompt_chars": frontdoor.PROMPT_CHARS, "variants": rows,
              "actor_stages_wall_ms": actor}
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    table = Table(title=f"the prefill rank's step, {frontdoor.PROMPT_CHARS}-token prompts (load {result['load_avg_1m']:.1f})")
    for col in ("variant", "steps", "p50 ms", "mean ms", "engine.step p50 ms"):
        table.add_column(col, justify="right")
    for name, row in rows.items():
        table.add_row(name, str(row["steps"]), fmt(row["step_p50_ms"]), fmt(row["step_mean_ms"]),
                      fmt(row["engine_step_p50_ms"]))
    Console().print(table)
    print(f"wrote {RESULT}", file=sys.stderr)


if __name__ == "__main__":
    main()
