"""Container healthcheck of the project image: exit 0 when every URL given is ready.

    python /app/deploy/docker/healthcheck.py http://127.0.0.1:8000/ready   # HTTP: any 2xx
    python /app/deploy/docker/healthcheck.py tcp://127.0.0.1:50061         # a listening port
    python /app/deploy/docker/healthcheck.py file:///tmp/ray/ray_current_cluster  # a file exists
Standard library only, so a probe costs one short interpreter start.
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.error
import urllib.request
from urllib.parse import urlsplit

TIMEOUT_S = 3.0


def probe(url: str) -> str | None:
    """None when ready, else why not."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        return None if os.path.exists(parts.path) else f"{url}: no such file"
    if parts.scheme == "tcp":
        try:
            socket.create_connection((parts.hostname, parts.port), timeout=TIMEOUT_S).close()
        except OSError as exc:
            return f"{url}: {exc}"
        return None
    if parts.scheme not in ("http", "https"):
        return f"{url}: scheme must be http, https, tcp or file"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as reply:
            return None if 200 <= reply.status < 300 else f"{url}: HTTP {reply.status}"
    except (urllib.error.URLError, OSError) as exc:
        return f"{url}: {exc}"


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: healthcheck.py URL [URL...]", file=sys.stderr)
        return 2
    for url in argv[1:]:
        problem = probe(url)
        if problem:
            print(problem, file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
