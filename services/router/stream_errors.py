"""What a client is told when its request fails in a worker: short, stable, retryable messages.

Every failure the router can meet once a request is routed ends as one of these (docs/operating.md
lists them); the exception itself goes to the router log, never to the client.
"""

from __future__ import annotations

import asyncio
import re

import grpc

from rackserve.routing.view import NoRankAvailable

INTERNAL = "internal error; retry the request (details in the router log)"
BUSY = "server busy; retry the request"
# Every message of a retryable answer (429/503 or an in-band stream error), this module's and the
# admission queue's (services/router/admission.py); docs/operating.md lists them and bench/faults/chaos.py
# judges each error it meets against them.
RETRYABLE = tuple(
    re.compile(p)
    for p in (
        r"worker (unavailable|timed out)( \((prefill|decode)\))?; retry the request",
        r"server busy(: rank queue full: \d+ requests admitted)?(; retry the request)?",
        r"too many requests: \d+ already queued",
        r"request waited \d+ s in the queue without a slot",
        r"the server is draining; retry on another instance",
    )
)


def is_retryable(message: str) -> bool:
    """True for a documented retryable message (nothing else, internals included)."""
    return any(p.fullmatch(message) for p in RETRYABLE)


def unavailable(role: str) -> str:
    """The message for a worker of `role` ("prefill" or "decode") that failed or is not there."""
    return f"worker unavailable ({role}); retry the request"


def timed_out(role: str) -> str:
    return f"worker timed out ({role}); retry the request"


class WorkerUnavailable(Exception):
    """A request cannot go on: its `role` worker failed (past the migration budget), timed out, or
    no healthy rank of that role is left. Retryable: the front door answers 503 + Retry-After
    before the first token, an in-band error event after it."""

    def __init__(self, role: str, timed_out: bool = False) -> None:
        self.role, self.timed_out = role, timed_out
        super().__init__(self.message)

    @property
    def message(self) -> str:
        return timed_out(self.role) if self.timed_out else unavailable(self.role)

    @classmethod
    def from_no_rank(cls, exc: NoRankAvailable) -> WorkerUnavailable:
        return cls(exc.role)


def stream_error_message(exc: BaseException) -> str:
    """The in-band message for a stream that failed after it started (the caller logs `exc`)."""
    if isinstance(exc, WorkerUnavailable):
        return exc.message
    if isinstance(exc, NoRankAvailable):
        return unavailable(exc.role)
    if isinstance(exc, grpc.aio.AioRpcError):
        if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return BUSY
        return "worker unavailable; retry the request"
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return "worker timed out; retry the request"
    return INTERNAL
