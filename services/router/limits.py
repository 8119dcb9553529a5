"""Request-body limits of the front door (size -> 413, UTF-8 and JSON nesting depth -> 400, a
body not all there within BODY_READ_TIMEOUT_S -> 408), the loopback-only bind rule, and `guard`,
which wraps the FastAPI app in every front-door check.

The body is read (at most `max_body_bytes`) before the app sees it, so an oversized, hostile or
never-finished body (a Content-Length beyond what is sent) never reaches pydantic or the workers.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
from itertools import accumulate

from rackserve.config import ClusterSection
from services.router.admission import Admission
from services.router.asgi import ASGIApp, Message, Receive, Scope, Send, send_json
from services.router.auth import BearerAuth, load_api_key
from services.router.openai_models import error_body

log = logging.getLogger("rackserve.router")

_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_BODY_METHODS = {"POST", "PUT", "PATCH"}
# uvicorn waits for a body as long as the connection stays open; a client that declared more
# than it sends gets OpenAI's 408 after this long (far above any real client's upload time).
BODY_READ_TIMEOUT_S = 30.0


def json_depth(body: bytes) -> int:
    """Deepest nesting of arrays/objects in a JSON text (brackets inside strings ignored)."""
    brackets = _JSON_STRING.sub(b"", body).translate(None, delete=_NOT_BRACKETS)
    steps = (1 if b in b"[{" else -1 for b in brackets)
    return max(accumulate(steps, initial=0))


def check_bind(cluster: ClusterSection, what: str) -> None:
    """Refuse a non-loopback `cluster.host` unless `cluster.public_bind`; log it when allowed."""
    host = cluster.host
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return
    if not cluster.public_bind:
        raise ValueError(
            f"cluster.host: {host!r} is not loopback; set cluster.public_bind: true to allow it"
        )
    log.warning("%s binds %s (cluster.public_bind is set): reachable off this machine", what, host)


class BodyLimits:
    """413 above `max_bytes`; 400 for bodies that are not UTF-8 or nest deeper than `max_depth`;
    408 for one not complete within `read_timeout_s`."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, max_depth: int,
        read_timeout_s: float = BODY_READ_TIMEOUT_S,
    ) -> None:
        self.app, self.max_bytes, self.max_depth = app, max_bytes, max_depth
        self.read_timeout_s = read_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(send)
            return
        try:
            async with asyncio.timeout(self.read_timeout_s):
                body = await self._read(receive)
        except TimeoutError:
            message = f"the request body did not arrive within {self.read_timeout_s:g} s"
            await send_json(send, 408, error_body(message, code="request_timeout"),
                            {"connection": "close"})
            return
        if body is None:
            await self._too_large(send)
            return
        problem = self._problem(body)
        if problem:
            await send_json(send, 400, error_body(problem))
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive: Receive) -> bytes | None:
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"".join(parts)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return None
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)

    def _problem(self, body: bytes) -> str | None:
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            return f"request body is not valid UTF-8 (byte {exc.start})"
        if json_depth(body) > self.max_depth:
            return f"request body nests deeper than {self.max_depth} levels"
        return None

    async def _too_large(self, send: Send) -> None:
        message = f"request body exceeds {self.max_bytes} bytes"
        await send_json(send, 413, error_body(message, code="request_too_large"))


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive() that yields the buffered body once, then defers (disconnects) to the client."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def guard(app: ASGIApp, cluster: ClusterSection) -> ASGIApp:
    """The front door as served: auth (if a key is set), then body limits, then admission."""
    guarded: ASGIApp = Admission(
        app, cluster.max_in_flight, cluster.max_queued, cluster.queue_timeout_s
    )
    guarded = BodyLimits(guarded, cluster.max_body_bytes, cluster.max_json_depth)
    key = load_api_key(cluster)
    if key is not None:
        log.info("front door: API key required on /v1 and /admin")
        guarded = BearerAuth(guarded, key)
    return guarded
