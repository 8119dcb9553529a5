"""Admission control at the front door: a bounded number of requests served at once, a bounded
queue in front of them, and drain.

- At most `max_in_flight` generation requests run (a stream holds its slot until it ends).
- Up to `max_queued` more wait for a slot; one more gets 429 with `Retry-After`.
- A request still waiting after `queue_timeout_s` (its queue deadline) gets 503.
- `POST /admin/drain` stops admitting (new requests and /ready get 503) while running ones
  finish; its reply says how many are still in flight and queued. `GET /admin/drain` reads that
  state, `DELETE /admin/drain` admits again. With `?instance=NAME` these act on one worker
  instance instead and are served by the app (services/router/app.py).
"""

from __future__ import annotations

import asyncio
import math

from services.router.asgi import ASGIApp, Receive, Scope, Send, send_json
from services.router.openai_models import error_body

ADMITTED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
RETRY_AFTER_S = 1


class Admission:
    """ASGI middleware holding the slot count, the queue length and the drain flag."""

    def __init__(
        self, app: ASGIApp, max_in_flight: int, max_queued: int, queue_timeout_s: float
    ) -> None:
        self.app = app
        self.max_queued = max_queued
        self.queue_timeout_s = queue_timeout_s
        self.slots = asyncio.Semaphore(max_in_flight)
        self.in_flight = 0
        self.queued = 0
        self.draining = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        if path == "/admin/drain" and scope.get("query_string"):  # one instance: the app's
            await self.app(scope, receive, send)
        elif path == "/admin/drain" and method == "POST":
            self.draining = True
            await send_json(send, 200, self.state())
        elif path == "/admin/drain" and method == "DELETE":
            self.draining = False
            await send_json(send, 200, self.state())
        elif path == "/admin/drain" and method == "GET":
            await send_json(send, 200, self.state())
        elif path == "/ready" and self.draining:
            await send_json(send, 503, {"ready": False, **self.state()})
        elif path in ADMITTED_PATHS and method == "POST":
            await self._admit(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    def state(self) -> dict:
        return {"draining": self.draining, "in_flight": self.in_flight, "queued": self.queued}

    async def _admit(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.draining:
            await _unavailable(send, "the server is draining; retry on another instance")
            return
        if self.slots.locked() and self.queued >= self.max_queued:
            body = error_body(
                f"too many requests: {self.queued} already queued", code="rate_limit_exceeded"
            )
            body["error"]["type"] = "rate_limit_error"
            await send_json(send, 429, body, {"retry-after": str(RETRY_AFTER_S)})
            return
        if not await self._wait_for_slot():
            wait = math.ceil(self.queue_timeout_s)
            await _unavailable(send, f"request waited {wait} s in the queue without a slot")
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            self.slots.release()

    async def _wait_for_slot(self) -> bool:
        self.queued += 1
        try:
            await asyncio.wait_for(self.slots.acquire(), self.queue_timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            self.queued -= 1


async def _unavailable(send: Send, message: str) -> None:
    body = error_body(message, code="service_unavailable", kind="server_error")
    await send_json(send, 503, body, {"retry-after": str(RETRY_AFTER_S)})
