"""Wait for a child service's one-line readiness banner (`<NAME> READY key=value ...`) on stdout.

Services started as processes (`python -m services.kvpool`, `python -m services.engram`) print
such a line once they serve; this reads it and returns its key=value fields.
"""

from __future__ import annotations

import selectors
import subprocess
import time


def read_ready(proc: subprocess.Popen[str], banner: str, timeout_s: float = 60.0) -> dict[str, str]:
    """Fields of the first stdout line starting with `banner` (e.g. "KVPOOL READY")."""
    assert proc.stdout is not None, "start the child with stdout=subprocess.PIPE, text=True"
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if not sel.select(timeout=0.5):
                continue
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{banner!r}: the process exited with {proc.wait()} before it was ready")
            if line.startswith(banner):
                return dict(part.split("=", 1) for part in line[len(banner):].split())
    finally:
        sel.close()
    raise RuntimeError(f"{banner!r}: no readiness line within {timeout_s}s")
