"""A body short of its Content-Length is answered 408 after the read timeout instead of holding
the connection open (services/router/limits.py's BodyLimits, on a real uvicorn on loopback)."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import uvicorn
from fastapi import FastAPI

from services.router.limits import BodyLimits

TIMEOUT_S = 0.5


def _app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/completions")
    async def echo(body: dict) -> dict:
        return body

    return app


def _post(port: int, declared: int, sent: bytes) -> tuple[bytes, float]:
    """Send a POST whose Content-Length says `declared` and whose body is `sent`; the reply."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        head = (f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                f"content-length: {declared}\r\n\r\n").encode()
        sock.sendall(head + sent)
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            part = sock.recv(65536)
            if not part:
                break
            reply += part
    return reply, time.monotonic() - started


async def test_a_body_short_of_its_length_is_a_408() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = BodyLimits(_app(), max_bytes=1 << 20, max_depth=32, read_timeout_s=TIMEOUT_S)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        full = json.dumps({"a": 1}).encode()
        short, waited = await asyncio.to_thread(_post, port, len(full) + 50, full)
        whole, _ = await asyncio.to_thread(_post, port, len(full), full)
    finally:
        server.should_exit = True
        await task
        sock.close()
    assert short.startswith(b"HTTP/1.1 408"), short[:200]
    error = json.loads(short.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "request_timeout" and "did not arrive" in error["message"]
    assert TIMEOUT_S <= waited < TIMEOUT_S + 5
    assert whole.startswith(b"HTTP/1.1 200") and whole.endswith(b"{\"a\":1}")
