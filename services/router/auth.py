"""Optional Bearer API key on the front door's /v1 and /admin routes (ASGI middleware).

The key comes from the config (`cluster.api_key`, e.g. env RACKSERVE_CLUSTER__API_KEY, or the first
line of `cluster.api_key_file`); it is never logged and compared in constant time.
"""

from __future__ import annotations

import hmac
from pathlib import Path

from rackserve.config import ClusterSection
from services.router.asgi import ASGIApp, Receive, Scope, Send, send_json
from services.router.openai_models import error_body

PROTECTED_PREFIXES = ("/v1/", "/admin/")


def load_api_key(cluster: ClusterSection) -> str | None:
    """The configured key (file wins over the inline value), or None when auth is off."""
    if cluster.api_key_file:
        lines = Path(cluster.api_key_file).read_text().splitlines()
        key = lines[0].strip() if lines else ""
        if not key:
            raise ValueError("cluster.api_key_file: the file's first line is empty")
        return key
    return cluster.api_key or None


def bearer_matches(header: bytes | None, key: str) -> bool:
    """True when `header` is exactly `Bearer <key>` (constant-time on the key)."""
    if header is None or not header.startswith(b"Bearer "):
        return False
    return hmac.compare_digest(header[len(b"Bearer ") :].strip(), key.encode())


class BearerAuth:
    """401 (OpenAI's invalid_api_key body) for protected paths without the right key."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app, self.key = app, key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PROTECTED_PREFIXES):
            header = dict(scope["headers"]).get(b"authorization")
            if not bearer_matches(header, self.key):
                body = error_body(
                    "Incorrect API key provided (send Authorization: Bearer <key>).",
                    code="invalid_api_key",
                )
                await send_json(send, 401, body, {"www-authenticate": "Bearer"})
                return
        await self.app(scope, receive, send)
