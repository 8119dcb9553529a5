"""Arrival sources: how a workload feeds the simulator (and the live load generator).

Open-loop traces hand every request over at start; closed-loop workloads (agentic sessions, a
batch-1 latency probe) issue a lane's next request only when its previous one is done.
"""

from __future__ import annotations

from typing import Protocol

from rackserve.workload.request import Request


class ArrivalSource(Protocol):
    def start(self) -> list[Request]:
        """Requests known before the run starts."""
        ...

    def on_done(self, request: Request, now_s: float) -> list[Request]:
        """`request` completed (or was rejected) at `now_s`: the requests this causes."""
        ...


class ListSource:
    """A fixed arrival list (a trace): everything at start, nothing on completion."""

    def __init__(self, requests: list[Request]) -> None:
        self.requests = sorted(requests, key=lambda r: (r.arrival_s, r.req_id))

    def start(self) -> list[Request]:
        return list(self.requests)

    def on_done(self, request: Request, now_s: float) -> list[Request]:
        return []
