"""The bench client's own overhead: can `rackserve bench` outrun the cluster it measures?

Part 1 (always): the client against a minimal SSE endpoint that streams instantly (no model, no
pacing), so the client and that endpoint are the only work: the client's ceiling in req/s and its
CPU time per request. Part 2 (`--url`, a cluster started unpaced: time_scale 0): the same client
against the real cluster: the cluster's request rate and the client's CPU share while it ran.
The client is not the bottleneck when its ceiling is well above the cluster's rate.

    .venv/bin/python bench/clients/bench_client_overhead.py [--url http://127.0.0.1:8000]
writes bench/results/clients/bench_client_overhead.json and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from rackserve.workload.request import Request
from rackserve.workload.source import ListSource
from services.bench.client import cluster_info, stream_completion
from services.bench.runner import Runner
from services.bench.summary import summarize
from services.bench.workload import BenchWorkload

RESULT = Path(__file__).resolve().parents[1] / "results" / "clients" / "bench_client_overhead.json"
STUB = r"""
import json, sys
import uvicorn
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

TOKENS = int(sys.argv[2])

async def completions(request):
    body = await request.json()
    n = body.get("max_tokens") or TOKENS
    async def gen():
        for i in range(n):
            yield b"data: " + json.dumps({"choices": [{"index": 0, "text": "x"}]}).encode() + b"\n\n"
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n,
                 "prompt_tokens_details": {"cached_tokens": 0}}
        yield b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
    return StreamingResponse(gen(), media_type="text/event-stream")

app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _workload(n: int, prompt_tokens: int, output_tokens: int) -> BenchWorkload:
    reqs = [Request(i, 0.0, prompt_tokens, output_tokens, ()) for i in range(n)]
    prompt = list(range(prompt_tokens))
    return BenchWorkload(ListSource(reqs), lambda _r: [t % 256 for t in prompt], n)


async def drive(
    url: str, model: str, n: int, concurrency: int, prompt_tokens: int, output_tokens: int
) -> dict:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=120.0, limits=limits) as client:

        async def send(out, prompt):
            return await stream_completion(client, url, model, out, prompt)

        runner = Runner(
            _workload(n, prompt_tokens, output_tokens), send, 0.0, concurrency=concurrency
        )
        cpu0 = time.process_time()
        run = await runner.run()
        cpu = time.process_time() - cpu0
    r = summarize(
        run.outcomes, run.wall_duration_s, 0.0, model_id=model, max_concurrency=concurrency
    )
    return {
        "requests": n, "concurrency": concurrency, "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
        "completed": r["completed"], "failed": r["failed"], "wall_s": round(run.wall_duration_s, 3),
        "req_per_s": round(r["completed"] / run.wall_duration_s, 1),
        "output_tok_per_s": round(r["total_output_tokens"] / run.wall_duration_s, 1),
        "client_cpu_ms_per_request": round(1000 * cpu / max(1, n), 3),
        "client_cpu_share": round(cpu / run.wall_duration_s, 3),
    }  # fmt: skip


def stub_ceiling(n: int, concurrency: int, output_tokens: int) -> dict:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", STUB, str(port), str(output_tokens)])
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        return asyncio.run(
            drive(f"http://127.0.0.1:{port}", "stub", n, concurrency, 256, output_tokens)
        )
    finally:
        proc.terminate()
        proc.wait(10)


def cluster_rate(url: str, n: int, concurrency: int, output_tokens: int) -> dict:
    async def go() -> dict:
        async with httpx.AsyncClient(timeout=30.0) as client:
            info = await cluster_info(client, url)
        if info["time_scale"] != 0:
            print(
                f"note: cluster time_scale={info['time_scale']} (pacing on): its rate is paced",
                file=sys.stderr,
            )
        res = await drive(url, info["model"], n, concurrency, 256, output_tokens)
        return res | {"time_scale": info["time_scale"]}

    return asyncio.run(go())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default=None, help="a running cluster (start it with time_scale 0)")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    p.add_argument("--output-tokens", type=int, default=16)
    p.add_argument("--cluster-requests", type=int, default=64)
    args = p.parse_args()
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result: dict = {"command": " ".join(["python", *sys.argv]), "date": now}
    runs = {
        f"stub c={c}": stub_ceiling(args.requests, c, args.output_tokens) for c in args.concurrency
    }
    if args.url:
        top = max(args.concurrency)
        runs[f"cluster c={top}"] = cluster_rate(
            args.url, args.cluster_requests, top, args.output_tokens
        )
        ratio = runs[f"stub c={top}"]["req_per_s"] / max(
            1e-9, runs[f"cluster c={top}"]["req_per_s"]
        )
        result["headroom_x"] = round(ratio, 1)
    result["runs"] = runs
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    cols = ("req/s", "out tok/s", "client CPU ms/req", "client CPU share", "failed")
    print(f"{'run':<18}" + "".join(f"{c:>19}" for c in cols))
    for name, r in runs.items():
        keys = (
            "req_per_s",
            "output_tok_per_s",
            "client_cpu_ms_per_request",
            "client_cpu_share",
            "failed",
        )
        print(f"{name:<18}" + "".join(f"{r[k]:>19}" for k in keys))
    if "headroom_x" in result:
        print(f"client ceiling / cluster rate: {result['headroom_x']}x")
    print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
