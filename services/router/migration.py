"""Live migration of a request whose decode rank failed mid-stream.

When a decode stream breaks (the rank's actor died, its step failed, the decode service is
unreachable), the router takes the failed rank out of routing for a while and continues the
request elsewhere: the prompt plus every token already sent to the client is prefilled again (its
prompt blocks come back from the KV pool as hits; the generated tail is recomputed) and decoded on
another rank for the tokens still owed. With greedy sampling the continuation is token-for-token
what the failed rank would have produced, and the client sees one unbroken stream: the tokens it
already has are never sent again and none are skipped.

A prefill rank that fails before the first token is quarantined the same way and the request is
routed again from the start (the client has seen nothing yet).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import fields, replace
from typing import Protocol

import grpc

from services.router.router_core import Route, RouterCore
from services.router.trip import Sampling, Trip


class Orchestrator(Protocol):
    """What migration needs of services/router/orchestrator.py (which imports this module)."""

    router: RouterCore

    def generate(self, trip: Trip, prompt: list[int], sampling: Sampling) -> AsyncIterator[list[int]]: ...

MAX_MIGRATIONS = 3  # per request; a request failing on more ranks than this gets the error
QUARANTINE_S = 5.0  # a failed rank is routed to again after this (Ray restarts its actor)
# bad input, our own cancel, a full rank queue (pushed back to the client as 429)
NOT_MIGRATED = frozenset(
    {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.CANCELLED, grpc.StatusCode.RESOURCE_EXHAUSTED}
)
SUFFIX = "-mig"


def within_budget(request_id: str) -> bool:
    """The request has been migrated fewer than MAX_MIGRATIONS times."""
    return request_id.count(SUFFIX) < MAX_MIGRATIONS


def sim_wait_s(wall_s: float, time_scale: float) -> float:
    """Wall seconds a client waited on a failed call, in simulated seconds; unpaced (0), one
    simulated second per wall second (the wait was real, whatever the pacing)."""
    return wall_s / time_scale if time_scale > 0 else wall_s


def quarantine(orch: Orchestrator, instance: str, rank: int) -> None:
    """Mark a failed rank unhealthy now and healthy again after QUARANTINE_S."""
    orch.router.mark_health(instance, rank, healthy=False)
    asyncio.get_running_loop().call_later(
        QUARANTINE_S, orch.router.mark_health, instance, rank, True
    )


async def reroute_prefill(
    orch: Orchestrator,
    trip: Trip,
    prompt: list[int],
    sampling: Sampling,
    failed: Route,
    waited_s: float = 0.0,
) -> AsyncIterator[list[int]]:
    """The prefill rank failed before any token was sent: run the request again elsewhere. The
    `waited_s` (simulated) spent on the failed rank counts as queueing: it is in ttft_s and in
    every token's time, as the client saw it."""
    quarantine(orch, failed.prefill_instance, failed.prefill_rank)
    orch.router.metrics.router.migrations.labels(from_role="prefill", to_role="prefill").inc()
    sub = Trip(f"{trip.request_id}{SUFFIX}", len(prompt))
    async for tokens in orch.generate(sub, prompt, sampling):
        yield tokens
    for f in fields(sub):
        if f.name != "request_id":
            setattr(trip, f.name, getattr(sub, f.name))
    trip.queue_s += waited_s
    trip.token_times_s = [waited_s + t for t in sub.token_times_s]
    trip.prefill = f"{failed.prefill_instance}/{failed.prefill_rank}->{sub.prefill}"


async def migrate(
    orch: Orchestrator,
    trip: Trip,
    prompt: list[int],
    sampling: Sampling,
    failed: Route,
    hung: bool = False,
) -> AsyncIterator[list[int]]:
    """Continue `trip` on another decode rank; yields only tokens the client has not had.

    A hung rank (no chunk within the deadline) stalls its whole instance (its steps are
    lockstep), so every rank of that instance is quarantined; a failed one only itself."""
    ranks = orch.router.ranks_of(failed.decode_instance) if hung else [failed.decode_rank]
    for rank in ranks:
        quarantine(orch, failed.decode_instance, rank)
    sent = list(trip.output_ids)
    remaining = sampling.max_tokens - len(sent)
    if remaining <= 0:
        trip.finish_reason = trip.finish_reason or "length"
        return
    orch.router.metrics.router.migrations.labels(from_role="decode", to_role="decode").inc()
    sub = Trip(f"{trip.request_id}{SUFFIX}", len(prompt) + len(sent))
    offset = trip.token_times_s[-1] if trip.token_times_s else trip.ttft_s
    # The tokens sent are outputs of this request: its penalties count them, min_tokens counts on.
    again = replace(
        sampling, max_tokens=remaining, min_tokens=max(0, sampling.min_tokens - len(sent)),
        prompt_tokens=sampling.prompt_tokens or len(prompt), prompt_logprobs=None,
    )
    async for tokens in orch.generate(sub, prompt + sent, again):
        new_times = sub.token_times_s[len(sub.token_times_s) - len(tokens) :]
        trip.token_times_s.extend(offset + t for t in new_times)
        trip.output_ids.extend(tokens)
        trip.logprobs.extend(sub.logprobs[len(sub.logprobs) - len(tokens) :])
        trip.completion_tokens += len(tokens)
        yield tokens
    trip.finish_reason = sub.finish_reason
    trip.decode = f"{trip.decode}->{sub.decode}"
    trip.pacing_lag_s += sub.pacing_lag_s
