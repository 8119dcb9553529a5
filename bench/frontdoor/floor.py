"""What one Python hop costs on this machine, measured beside bench/frontdoor/overhead.py in the same run:
the floor under any front door made of Python processes.

- http_sse: a bare ASGI app under uvicorn (the router's server, with each loop and HTTP
  parser) that answers a POST with one SSE event at once; the client is bench/frontdoor/overhead.py's
  own (`stream_one`), so this is one HTTP hop's TTFT with no work behind it.
- grpc_unary: a bare grpc.aio server echoing bytes; one unary call as the router makes them.

Each server runs in its own process on 127.0.0.1 (`serve`, started by `start`) and is stopped by
its PID. Alone: `bench/frontdoor/overhead.py --only floor`.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx

from bench.frontdoor import stream_client
from services.event_loop import run as run_loop
from services.event_loop import uvicorn_options
from services.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]

METHOD = "/floor.Echo/Echo"
SSE = b'data: {"choices":[{"text":"x","index":0}]}\n\ndata: [DONE]\n\n'


async def sse_app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": SSE})


def serve_http(port: int) -> None:
    import uvicorn

    config = uvicorn.Config(sse_app, host="127.0.0.1", port=port, log_level="warning",
                            lifespan="off", **uvicorn_options())  # fmt: skip
    run_loop(uvicorn.Server(config).serve())


async def _serve_grpc(port: int) -> None:
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    generic = grpc.method_handlers_generic_handler("floor.Echo", {"Echo": handler})
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((generic,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def start(kind: str, loop: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = {**os.environ, "RACKSERVE_EVENT_LOOP": loop}
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from bench.frontdoor import floor; floor.serve({kind!r}, {port})"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    return proc, port


async def http_floor(n: int, loop: str) -> list[float]:
    proc, port = start("http", loop)
    try:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(timeout=30) as client:
            for _ in range(100):  # until it listens
                try:
                    await stream_client.stream_one(client, base, 0, 1)
                    break
                except httpx.TransportError:
                    await asyncio.sleep(0.1)
            return [(await stream_client.stream_one(client, base, i, 1))[0] for i in range(n)]
    finally:
        proc.terminate()
        proc.wait(30)


async def grpc_floor(n: int, loop: str) -> list[float]:
    proc, port = start("grpc", loop)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            echo = channel.unary_unary(METHOD)
            await echo(b"x" * 256, wait_for_ready=True, timeout=30)
            out = []
            for _ in range(n):
                t0 = time.perf_counter()
                await echo(b"x" * 256)
                out.append(time.perf_counter() - t0)
            return out
    finally:
        proc.terminate()
        proc.wait(30)


def run_floor(n: int) -> dict:
    """Per server loop ("uvloop": uvloop + httptools, "asyncio": asyncio + h11), the summaries of
    `n` sequential bare HTTP SSE requests (client TTFT) and `n` bare gRPC unary calls; the
    rounds alternate so both see the same load."""
    samples: dict[str, dict[str, list[float]]] = {}
    for _ in range(2):
        for loop in ("uvloop", "asyncio"):
            got = samples.setdefault(loop, {"http_sse_ttft_ms": [], "grpc_unary_ms": []})
            got["http_sse_ttft_ms"] += asyncio.run(http_floor(n // 2, loop))
            got["grpc_unary_ms"] += asyncio.run(grpc_floor(n // 2, loop))
    return {
        loop: {k: stream_client.summary(v) for k, v in got.items()} for loop, got in samples.items()
    }


def serve(kind: str, port: int) -> None:
    """One bare server, "http" or "grpc", in this process until it is stopped."""
    if kind == "http":
        serve_http(port)
    else:
        run_loop(_serve_grpc(port))
