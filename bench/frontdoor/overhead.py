"""Front-door overhead: what router + gRPC + Ray + the P->D hand-off add over the engine in-process.

Pacing off (time_scale 0), so every number is real wall time on this machine:
- in-process: one `Engine` (the same model and config), TTFT = add_request -> first token, ITL =
  one decode step (half the requests before the cluster runs, half after); requests/s = a batch
  of short requests run to completion.
- cluster: `rackserve up` (scenarios/local.yaml, unpaced) and streaming completions over HTTP:
  TTFT = request sent -> first SSE chunk, ITL = mean gap between chunks; requests/s = a closed
  loop of short completions at a fixed concurrency.

    .venv/bin/python bench/frontdoor/overhead.py [--requests 24] [--concurrency 16]
writes bench/results/frontdoor/overhead.json and prints a table. Every run also records where the
cluster's TTFT went, hop by hop ("stages_wall_ms": the front door's
rackserve_frontdoor_stage_wall_seconds, stages.py), its CPU per request by process role (cpu.py),
and what one bare Python HTTP hop and one bare gRPC call cost on this machine meanwhile ("floor",
floor.py). Options:
- `--dynamo` [--dynamo-mode agg|disagg]: the same run also puts NVIDIA Dynamo's frontend + mocker
  workers under the same load (dynamo_peer.py) and records the ratio of our overhead to Dynamo's
  latency ("dynamo", "dynamo_ratio");
- `--engine mock` [--mock-ranks actor|service]: the cluster and the in-process reference over mock
  ranks (no model math), the equal-work peer of Dynamo's mocker; stored under "mock" and
  "mock_runs";
- `--only dynamo` [--workers N]: Dynamo's side alone, merged into the JSON beside our figures there;
- `--only floor`: the bare-hop floor alone, printed (nothing written).
"""

from __future__ import annotations

import os

# One BLAS thread, as Ray gives its rank actors: on 2 shared cores a multi-threaded BLAS spins
# against the other processes and a 64-token prefill takes seconds instead of ~70 ms.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import httpx  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: `bench.frontdoor`
from bench.frontdoor import cpu, floor, stages  # noqa: E402
from bench.frontdoor.stream_client import (  # noqa: E402, F401 - names kept for notes/frontdoor_rank_step.py
    MODEL,
    OUTPUT_TOKENS,
    PROMPT_CHARS,
    RATE_OUTPUT_TOKENS,
    RESULT,
    cluster_rate,
    non_stream_latency,
    prompt_text,
    stream_one,
    summary,
)
from rackserve.config import load_config  # noqa: E402
from rackserve.model import tokenizer  # noqa: E402
from rackserve.model.config import ModelConfig  # noqa: E402
from rackserve.model.engine import Engine  # noqa: E402
from rackserve.model.sampling import SamplingParams  # noqa: E402
from services.launcher import DEFAULT_CONFIG  # noqa: E402
from services.redis_server import free_port  # noqa: E402

ENGINE = "real"  # --engine: the cluster's ranks and the in-process baseline alike


def new_engine() -> Engine:
    cfg = load_config(DEFAULT_CONFIG)
    if ENGINE == "mock":  # the ranks of `rackserve up --engine mock`: the model's work is gone
        from rackserve.model.mock_engine import MockEngine

        return MockEngine.from_deployment(cfg)
    model = ModelConfig.from_sections(cfg.engine, cfg.engram)
    return Engine.from_config(
        model,
        num_blocks=cfg.engine.cache_blocks_per_rank,
        max_num_batched_tokens=cfg.engine.max_num_batched_tokens,
        max_num_seqs=cfg.engine.max_num_seqs,
    )


def in_process_latency(n: int) -> dict:
    """TTFT and ITL of `n` requests, half before the cluster's phase and half after it (the
    load of a shared machine drifts: both windows are represented)."""
    ttfts, itls, e2es = in_process_samples(n - n // 2)
    return {"ttft_s": ttfts, "itl_s": itls, "e2e_s": e2es}


def in_process_samples(n: int) -> tuple[list[float], list[float], list[float]]:
    engine = new_engine()
    warm = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    engine.add_request("warm-up", tokenizer.encode(prompt_text(99_999)), warm)
    while engine.has_unfinished():
        engine.step()
    ttfts, itls, e2es = [], [], []
    for i in range(n):
        params = SamplingParams(max_tokens=OUTPUT_TOKENS, temperature=0.0, ignore_eos=True)
        t0 = time.perf_counter()
        engine.add_request(f"lat-{i}", tokenizer.encode(prompt_text(i)), params)
        times = []
        while engine.has_unfinished():
            if any(o.token is not None for o in engine.step().outputs):
                times.append(time.perf_counter())
        ttfts.append(times[0] - t0)
        e2es.append(times[-1] - t0)
        itls += [b - a for a, b in zip(times, times[1:], strict=False)]
    return ttfts, itls, e2es


def in_process_rate(n: int) -> dict:
    engine = new_engine()
    t0 = time.perf_counter()
    for i in range(n):
        params = SamplingParams(max_tokens=RATE_OUTPUT_TOKENS, temperature=0.0, ignore_eos=True)
        engine.add_request(f"rate-{i}", tokenizer.encode(prompt_text(10_000 + i)), params)
    while engine.has_unfinished():
        engine.step()
    return {"requests": n, "requests_per_s": n / (time.perf_counter() - t0)}


# -- cluster -----------------------------------------------------------------------------------
MOCK_RANKS = "actor"


def start_cluster(port: int) -> tuple[subprocess.Popen, dict[str, str]]:
    """`rackserve up` unpaced; returns it and the addresses it prints ("redis", "kv pool (gRPC)", ...)."""
    env = {**os.environ, "RACKSERVE_CLUSTER__TIME_SCALE": "0", "RACKSERVE_ENGINE__MOCK_RANKS": MOCK_RANKS}
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.launcher", "--port", str(port), "--engine", ENGINE],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    addresses: dict[str, str] = {}
    for line in proc.stdout:  # type: ignore[union-attr]
        parts = line.strip().rsplit(None, 1)
        if line.startswith("  ") and len(parts) == 2:
            addresses[parts[0].strip()] = parts[1]
        if line.strip().startswith("logs"):
            return proc, addresses
    raise RuntimeError("rackserve up exited before it was up")


async def cluster_latency(base: str, n: int) -> dict:
    ttfts, itls = [], []
    async with httpx.AsyncClient(timeout=120) as client:
        await stream_one(client, base, 99_999, 2)  # warm-up: connections, first steps
        before = await asyncio.to_thread(stages.scrape, base)
        for i in range(n):
            ttft, gaps = await stream_one(client, base, 20_000 + i, OUTPUT_TOKENS)
            ttfts.append(ttft)
            itls += gaps
        after = await asyncio.to_thread(stages.scrape, base)
    by_stage = stages.summary(stages.delta(before, after))
    return {"ttft_ms": summary(ttfts), "itl_ms": summary(itls), "stages_wall_ms": by_stage}


# -- report ------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--rate-requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--dynamo", action="store_true", help="also run Dynamo frontend + mocker")
    parser.add_argument("--engine", default="real", choices=("real", "mock"),
                        help="mock: rackserve's mock ranks (no model math), the equal-work peer of "
                             "Dynamo's mocker; the run is stored under 'mock' in the JSON")
    parser.add_argument("--mock-ranks", default="actor", choices=("actor", "service"),
                        help="engine.mock_ranks: an instance's mock ranks in one Ray actor, or in the "
                             "worker service's process (no Ray hop per step)")
    parser.add_argument("--dynamo-mode", default="agg", choices=("agg", "disagg"),
                        help="Dynamo's workers: aggregated mockers behind round-robin, or a prefill "
                             "and a decode mocker behind its KV router (our path's shape: P->D)")
    parser.add_argument("--only", choices=("dynamo", "floor"),
                        help="dynamo: Dynamo's side alone, merged into the JSON beside our figures "
                             "there; floor: the bare HTTP/gRPC hop floor alone, printed")
    parser.add_argument("--workers", type=int, default=2, help="--only dynamo: aggregated mockers")
    args = parser.parse_args()
    if args.only == "floor":
        print(json.dumps(floor.run_floor(args.requests), indent=2))
        return
    if args.only == "dynamo":
        from bench.frontdoor import dynamo_peer

        dynamo_peer.run_alone(args, "bench/frontdoor/overhead.py " + " ".join(sys.argv[1:]))
        return
    global ENGINE, MOCK_RANKS
    ENGINE, MOCK_RANKS = args.engine, args.mock_ranks
    first = in_process_latency(args.requests)
    port = free_port()
    proc, _ = start_cluster(port)
    try:
        base = f"http://127.0.0.1:{port}"
        cpu_before = cpu.snapshot(proc.pid)
        t0 = time.perf_counter()
        latency = asyncio.run(cluster_latency(base, args.requests))
        wall_s = time.perf_counter() - t0
        if ENGINE == "mock":
            latency |= asyncio.run(non_stream_latency(base, args.requests))
        cpu_ms = cpu.per_role_ms(cpu_before, cpu.snapshot(proc.pid), args.requests)
        cluster = {
            **latency,
            "latency_phase_wall_ms_per_request": 1000 * wall_s / args.requests,
            "latency_phase_cpu_ms_per_request": cpu_ms,
            **asyncio.run(cluster_rate(base, args.rate_requests, args.concurrency)),
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    ttfts, itls, e2es = in_process_samples(args.requests // 2)
    local = {
        "ttft_ms": summary(first["ttft_s"] + ttfts),
        "itl_ms": summary(first["itl_s"] + itls),
        "e2e_ms": summary(first["e2e_s"] + e2es),
        **in_process_rate(args.rate_requests),
    }
    result = {
        "command": "bench/frontdoor/overhead.py " + " ".join(sys.argv[1:]),
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_1m": os.getloadavg()[0],
            "python": platform.python_version(),
        },
        "workload": {
            "prompt_tokens": PROMPT_CHARS,
            "output_tokens": OUTPUT_TOKENS,
            "rate_output_tokens": RATE_OUTPUT_TOKENS,
            "time_scale": 0,
            "engine": ENGINE,
            "mock_ranks": MOCK_RANKS if ENGINE == "mock" else None,
        },
        "in_process": local,
        "cluster": cluster,
        "overhead_ms": {
            "ttft_p50": cluster["ttft_ms"]["p50"] - local["ttft_ms"]["p50"],
            # The twin releases the first token after the decode rank's first step (TTFT =
            # queue + prefill + transfer + first decode, as the target): less that step's compute.
            "ttft_p50_less_first_decode_step": cluster["ttft_ms"]["p50"]
            - local["ttft_ms"]["p50"] - local["itl_ms"]["p50"],
            "itl_p50": cluster["itl_ms"]["p50"] - local["itl_ms"]["p50"],
        },
        "floor": floor.run_floor(args.requests),
        "dynamo": None,  # filled by --dynamo (dynamo_peer.py)
    }
    if args.dynamo:
        from bench.frontdoor import (
            dynamo_peer,  # the peer side; needs .venv-peers (../shared/ENVIRONMENT.md)
        )

        result["dynamo"] = dynamo_peer.run_dynamo(
            args.requests, args.rate_requests, args.concurrency, mode=args.dynamo_mode
        )
        result["dynamo"]["load_avg_1m"] = os.getloadavg()[0]
        result["dynamo_ratio"] = dynamo_peer.comparison(result)
    if ENGINE == "mock":
        result["overhead_ms"]["non_stream_e2e_p50"] = (cluster["non_stream_e2e_ms"]["p50"]
                                                      - local["e2e_ms"]["p50"])
        if result["dynamo"]:
            result["ttft_p50_mock_overhead_over_dynamo"] = dynamo_peer.mock_comparison(result)
        stored = json.loads(RESULT.read_text()) if RESULT.exists() else {}
        key = f"mock_{MOCK_RANKS}_vs_dynamo_{args.dynamo_mode}" if args.dynamo else f"mock_{MOCK_RANKS}"
        stored.setdefault("mock_runs", {})[key] = result
        stored["mock"] = result  # the latest mock run
        if "ttft_p50_mock_overhead_over_dynamo" in result:
            ratios = stored.get("ttft_p50_mock_overhead_over_dynamo", {})
            ratios = ratios if "runs" in ratios else {"runs": {}}
            ratios["runs"][key] = result["ttft_p50_mock_overhead_over_dynamo"]
            ratios.update(result["ttft_p50_mock_overhead_over_dynamo"])  # the latest, at the top
            stored["ttft_p50_mock_overhead_over_dynamo"] = ratios
        RESULT.write_text(json.dumps(stored, indent=2) + "\n")
    else:
        stored = json.loads(RESULT.read_text()) if RESULT.exists() else {}
        keep = {k: stored[k] for k in ("mock", "mock_runs", "ttft_p50_mock_overhead_over_dynamo") if k in stored}
        RESULT.write_text(json.dumps({**result, **keep}, indent=2) + "\n")
    print(f"{'':24s}{'in-process':>12s}{'cluster':>12s}{'overhead':>12s}")
    for key in ("ttft_ms", "itl_ms"):
        a, b = local[key]["p50"], cluster[key]["p50"]
        print(f"{key + ' p50':24s}{a:12.2f}{b:12.2f}{b - a:12.2f}")
    print(f"{'requests/s':24s}{local['requests_per_s']:12.1f}{cluster['requests_per_s']:12.1f}")
    print(f"{'- one decode step':24s}{'':12s}{'':12s}"
          f"{result['overhead_ms']['ttft_p50_less_first_decode_step']:12.2f}")
    for loop, hop in result["floor"].items():
        print(f"floor, {loop:8s}: bare HTTP SSE hop TTFT p50 {hop['http_sse_ttft_ms']['p50']:.2f}"
              f" ms, bare gRPC unary p50 {hop['grpc_unary_ms']['p50']:.2f} ms")
    stages.table(cluster["stages_wall_ms"])
    cpu_ms = cluster["latency_phase_cpu_ms_per_request"]
    print(f"latency phase: {cluster['latency_phase_wall_ms_per_request']:.1f} ms wall per request, "
          f"CPU ms per request: " + ", ".join(f"{k} {v:.1f}" for k, v in cpu_ms.items()))
    if args.dynamo:
        dynamo_peer.table(result)
    print(f"(load avg {result['machine']['load_avg_1m']:.1f} on {os.cpu_count()} cpus) -> {RESULT}")


if __name__ == "__main__":
    main()
