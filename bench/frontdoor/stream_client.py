"""The client side shared by the front-door benchmarks (bench/frontdoor/overhead.py and its peers
floor.py, dynamo_peer.py, notes/frontdoor_rank_step.py): the prompts, one timed stream,
the summary of timings, and where the results go. Imports none of them (no import circle)."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import httpx

RESULT = Path(__file__).resolve().parents[1] / "results" / "frontdoor" / "overhead.json"
MODEL = "rackserve-moe-small"
PROMPT_CHARS = 64
OUTPUT_TOKENS = 16
RATE_OUTPUT_TOKENS = 8


def prompt_text(i: int) -> str:
    """Distinct prompts (no prefix reuse between requests), PROMPT_CHARS bytes each."""
    return f"req {i:05d} " + ("the rack twin serves tokens " * 4)[: PROMPT_CHARS - 10]


# -- in-process --------------------------------------------------------------------------------
async def stream_one(
    client: httpx.AsyncClient, base: str, i: int, max_tokens: int
) -> tuple[float, list[float]]:
    body = {
        "model": MODEL,
        "prompt": prompt_text(i),
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    t0 = time.perf_counter()
    arrivals = []
    async with client.stream("POST", f"{base}/v1/completions", json=body) as reply:
        async for line in reply.aiter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.perf_counter())
    return arrivals[0] - t0, [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]


def summary(values_s: list[float]) -> dict:
    ms = sorted(v * 1000 for v in values_s)
    return {
        "p50": statistics.median(ms),
        "p90": ms[int(0.9 * (len(ms) - 1))],
        "mean": statistics.fmean(ms),
    }


async def cluster_rate(base: str, n: int, concurrency: int) -> dict:
    queue = list(range(30_000, 30_000 + n))

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            await stream_one(client, base, queue.pop(), RATE_OUTPUT_TOKENS)

    async with httpx.AsyncClient(
        timeout=300, limits=httpx.Limits(max_connections=concurrency)
    ) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    return {"requests": n, "concurrency": concurrency, "requests_per_s": n / elapsed}


async def non_stream_latency(base: str, n: int) -> dict:
    """Request -> full non-streamed reply of OUTPUT_TOKENS tokens, same prompts as the latency run.

    Dynamo's streamed replies carry a ~40 ms stall on most requests here (a TCP delayed-ACK-like
    gap on the SSE path) that its non-streamed replies do not, so both are recorded (for
    Dynamo, and for our mock-rank cluster beside it).
    """
    times = []
    async with httpx.AsyncClient(timeout=120) as client:
        for i in range(n):
            body = {
                "model": MODEL,
                "prompt": prompt_text(20_000 + i),
                "max_tokens": OUTPUT_TOKENS,
                "temperature": 0,
                "ignore_eos": True,
            }
            t0 = time.perf_counter()
            (await client.post(f"{base}/v1/completions", json=body)).raise_for_status()
            times.append(time.perf_counter() - t0)
    return {"non_stream_e2e_ms": summary(times)}
