"""The front door's streamed response, and the JSON encoder of its events.

Its headers and first event go out the moment the handler returns it, then the rest streams as
Starlette's StreamingResponse does (which, under an ASGI 2.3 server such as uvicorn, first starts
a task group to listen for the client's disconnect and only then, a loop turn later, sends the
headers: on the first token's path)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

try:  # a dependency (pyproject.toml); a venv installed before it was added falls back to json
    from orjson import dumps
except ImportError:  # pragma: no cover

    def dumps(payload: dict) -> bytes:
        return json.dumps(payload, separators=(",", ":")).encode()


class SSEResponse(StreamingResponse):
    def __init__(self, first: bytes, rest: AsyncIterator[bytes], headers: dict[str, str]) -> None:
        super().__init__(rest, media_type="text/event-stream", headers=headers)
        self.first = first

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = {"type": "http.response.start", "status": self.status_code}
        await send({**start, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.first, "more_body": True})
        await super().__call__(scope, receive, send)  # the rest, listening for a disconnect

    async def stream_response(self, send: Send) -> None:
        """The events after the first (the headers are sent already)."""
        async for chunk in self.body_iterator:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
