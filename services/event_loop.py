"""The event loop and HTTP parser of every asyncio service process: uvloop and httptools when
installed (they are dependencies; a plain asyncio loop and h11 otherwise). On the first-token
path each process hop pays its loop's wake-up and its parser; `RACKSERVE_EVENT_LOOP=asyncio`
selects the standard ones (bench/frontdoor/floor.py measures both)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Coroutine
from typing import Any


def fast() -> bool:
    """Whether uvloop + httptools are used here."""
    if os.environ.get("RACKSERVE_EVENT_LOOP", "uvloop") == "asyncio":
        return False
    return all(importlib.util.find_spec(m) is not None for m in ("uvloop", "httptools"))


def run(main: Coroutine[Any, Any, Any]) -> Any:
    """asyncio.run(main) on uvloop when `fast()`."""
    if fast():
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def uvicorn_options() -> dict[str, str]:
    """uvicorn.Config's loop and http settings matching `run`."""
    if fast():
        return {"loop": "uvloop", "http": "httptools"}
    return {"loop": "asyncio", "http": "h11"}
