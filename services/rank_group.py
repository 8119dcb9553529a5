"""An instance's ranks in one process: one Ray actor (`RankGroup`) holds every RankWorker of the
instance, and each rank keeps a handle (`GroupedRank`) that answers like its own actor would.

Used for mock ranks (engine.kind mock), where a rank's work is bookkeeping, not a model: 72 rank
actors (~90 MiB each) would not fit a small machine, 13 instance actors do. The instance loop
calls `step.remote()` on every rank of a step in one go; those calls are sent to the group as
one `step_ranks` call (one Ray round trip per instance step), and each rank's answer (or its own
exception) resolves that rank's call. Failure is per process: a killed group restarts every rank
of the instance (empty), as a killed rank actor restarts one.

With `engine.mock_ranks: service` the group runs in the worker service's own process instead
(`InProcessGroup`), on one thread of its own (calls in order, the event loop never blocked by a
rank's Redis and pool calls): a step costs a thread hop (~0.1 ms) instead of a Ray round trip
(~1.6 ms, bench/results/frontdoor/overhead.json), which is what Dynamo's mocker does inside its worker. Its
ranks then live and restart with the service.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rackserve.config import Config
from services.rank_inbox import Submission
from services.rank_worker import RankState, RankStep, RankWorker


class RankGroup:
    """Every DP rank of one instance, stepped in this one process (its actor form: ray.remote)."""

    def __init__(self, cfg: Config, role: str, instance: str, ranks: int, redis_url: str,
                 pool_addr: str) -> None:
        self.workers = [RankWorker(cfg, role, instance, r, redis_url, pool_addr) for r in range(ranks)]

    def step_ranks(self, inboxes: dict[int, tuple[Submission, ...]]) -> dict[int, RankStep | Exception]:
        """One step of each named rank, with its submissions; a rank's failure is its answer."""
        answers: dict[int, RankStep | Exception] = {}
        for rank, inbox in inboxes.items():
            try:
                answers[rank] = self.workers[rank].step(inbox)
            except Exception as exc:  # only this rank's requests fail (instance_loop._fail_rank)
                answers[rank] = exc
        return answers

    def cancel(self, rank: int, request_id: str) -> None:
        self.workers[rank].cancel(request_id)

    def ready(self, rank: int | None = None) -> bool:
        ranks = self.workers if rank is None else [self.workers[rank]]
        return all(w.ready() for w in ranks)

    def state(self, rank: int) -> RankState:
        return self.workers[rank].state()


@dataclass(frozen=True)
class _Method:
    """`handle.<method>.remote(...)`, as on a Ray actor handle."""

    remote: Any


class InProcessGroup:
    """A RankGroup in this process, with the handle of its actor form: `<method>.remote(...)`
    returns an awaitable, run on the group's own thread."""

    def __init__(self, group: RankGroup, name: str) -> None:
        self.group = group
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ranks-{name}")
        self.step_ranks = _Method(lambda inboxes: self._call(group.step_ranks, inboxes))
        self.cancel = _Method(lambda rank, request_id: self._call(group.cancel, rank, request_id))
        self.ready = _Method(lambda rank=None: self._call(group.ready, rank))
        self.state = _Method(lambda rank: self._call(group.state, rank))

    def _call(self, fn: Callable, *args: Any) -> asyncio.Future:
        return asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def close(self) -> None:
        """The instance stops (the planner drained it): its thread ends once idle."""
        self._thread.shutdown(wait=False)


class StepBatcher:
    """Collects the step calls made in one event-loop turn into one `step_ranks` call."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self._pending: dict[int, tuple[tuple[Submission, ...], asyncio.Future]] = {}

    def step(self, rank: int, inbox: tuple[Submission, ...] = ()) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        assert rank not in self._pending, "a rank has one step call in flight at a time"
        self._pending[rank] = (inbox, future)
        return future

    def _flush(self) -> None:
        pending, self._pending = self._pending, {}
        ref = self.group.step_ranks.remote({r: inbox for r, (inbox, _) in pending.items()})
        asyncio.ensure_future(self._deliver(ref, pending))

    @staticmethod
    async def _deliver(ref: Any, pending: dict[int, tuple[tuple, asyncio.Future]]) -> None:
        try:
            answers = await ref
        except Exception as exc:  # the group died: every rank of the call failed
            answers = {r: exc for r in pending}
        for r, (_, future) in pending.items():
            if future.done():
                continue
            answer = answers[r]
            if isinstance(answer, Exception):
                future.set_exception(answer)
            else:
                future.set_result(answer)


class GroupedRank:
    """One rank of a `RankGroup`, with the methods the services call on a rank actor."""

    def __init__(self, batcher: StepBatcher, rank: int) -> None:
        self.group = group = batcher.group  # the instance's one actor (or InProcessGroup)
        self.step = _Method(lambda inbox=(): batcher.step(rank, inbox))
        self.cancel = _Method(lambda request_id: group.cancel.remote(rank, request_id))
        self.ready = _Method(lambda: group.ready.remote(rank))
        self.state = _Method(lambda: group.state.remote(rank))
