"""The lockstep loop of one engine instance: every step, every rank actor computes; the step lasts
as long as the slowest rank (the MoE dispatch is a barrier), paced by the cost model.

A step's wall time is max(real compute of all ranks, StepCost.total_s x time_scale). The loop
keeps the instance's simulated clock (the sum of its steps' simulated durations), which is what
every latency it reports is measured on; a rank's idle time is total_s - its busy time.

Requests reach a rank on its step call (`submit`: services/rank_inbox.py), so admission costs no
Ray call of its own. A rank that was idle joins the step carrying its submissions; if it has not
answered JOIN_GRACE_S into the step, the ranks already in lockstep have, and another rank needs
a step (it is busy or was given work), it is left behind (its process may be stopped): the
siblings step on without it, and its answer, whenever it comes, counts in the step after (a
failed late answer fails only that rank's requests). A hung rank therefore stalls only the
requests sent to it (the router times them out and re-routes), never its instance's other ranks,
as when admission was a Ray call of its own that the loop waited for before waking the rank.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from rackserve.metrics import ProcessMetrics, RankKey
from rackserve.timing.batch import RankBatch, StepBatch, StepCost
from services.pacing import sleep_paced
from services.rank_idle import RankIdleExport
from services.rank_inbox import FAILED, AdmitResult, Submission
from services.rank_worker import Emitted, RankStep
from services.stage_timer import now_s, observe, record
from services.topology import InstanceSpec

log = logging.getLogger(__name__)


IDLE = RankStep(RankBatch.of([]), (), busy=False)  # a rank with nothing to do waits at the barrier
JOIN_GRACE_S = 2.0  # a joining rank silent this long (the health probe's deadline) is left behind
LEAVE_POLL_S = 0.05  # ... once another rank needs a step; checked this often meanwhile


@dataclass(frozen=True)
class StepDone:
    """What the loop tells its service after a step: one rank's emissions at simulated time."""

    instance: str
    rank: int
    emitted: tuple[Emitted, ...]
    sim_now_s: float  # the instance's simulated clock at the end of the step
    step_s: float  # the step's simulated duration (it began at sim_now_s - step_s)
    lag_s: float
    error: str = ""  # set when the step failed: every request of the instance is failed (rank
    # -1), or only those of `rank` (a rank left behind whose late call failed)

    def fails(self, instance: str, rank: int) -> bool:
        """This failure fails the requests on (instance, rank)."""
        return bool(self.error) and instance == self.instance and self.rank in (-1, rank)


@dataclass
class _Call:
    """One rank's step call in flight, with the submissions it carries and their answers' futures."""

    task: asyncio.Future
    futures: tuple[asyncio.Future, ...]


class InstanceLoop:
    """Owns one instance's rank actors; `submit()` work to any of them (or `wake()` a rank)."""

    def __init__(
        self,
        spec: InstanceSpec,
        ranks: list,
        price: Callable[[StepBatch], StepCost],
        time_scale: float,
        metrics: ProcessMetrics,
        on_step: Callable[[StepDone], None],
        idle: RankIdleExport | None = None,
    ) -> None:
        """`idle`: the process's idle-while-waiting export, shared by its instances' loops."""
        self.spec = spec
        self.ranks = ranks
        self.price = price
        self.time_scale = time_scale
        self.metrics = metrics
        self.on_step = on_step
        self.sim_now_s = 0.0
        self.pacing_lag_s = 0.0
        self._wake = asyncio.Event()
        self._active: set[int] = set()  # ranks with requests; idle ranks are not called
        self._woken: set[int] = set()  # ranks woken since their last call: never dropped as idle
        self._busy: set[int] = set()  # ranks whose last answer still had requests: in lockstep
        self._inbox: dict[int, list[tuple[Submission, asyncio.Future]]] = {}
        self._flight: dict[int, _Call] = {}  # this step's calls (and late answers it takes)
        self._behind: dict[int, _Call] = {}  # ranks left behind: their call is still out
        self._keys = [RankKey(spec.name, r, spec.role) for r in range(len(ranks))]
        self.idle = idle
        metrics.ranks.declare_instance(spec.name, spec.role, spec.gpus)

    def wake(self, rank: int) -> None:
        """Work is waiting for `rank`: it takes part in the next step."""
        self._active.add(rank)
        self._woken.add(rank)
        self._wake.set()

    def submit(self, rank: int, submission: Submission) -> asyncio.Future:
        """Queue `submission` for `rank`'s next step call; the future gets its AdmitResult (an
        exception when that step failed)."""
        future = asyncio.get_running_loop().create_future()
        self._inbox.setdefault(rank, []).append((submission, future))
        self.wake(rank)
        return future

    def cancel(self, rank: int, request_id: str) -> None:
        """Drop a request from `rank`: still queued here, it is never sent; sent, a cancel call
        follows it (a rank runs its calls in order, so it lands after the step that admitted
        it). Fire and forget: a dead or restarting rank has dropped it anyway, and a cancel
        never joins a step (it cannot fail one)."""
        queued = self._inbox.get(rank, [])
        for i, (submission, future) in enumerate(queued):
            if submission.request_id == request_id:
                del queued[i]
                future.cancel()
                return
        try:
            self.ranks[rank].cancel.remote(request_id)
        except Exception:  # the actor is gone: nothing to drop
            log.debug("%s/%d: cancel of %s not sent", self.spec.name, rank, request_id)

    async def run(self) -> None:
        busy = False
        while True:
            if not busy:
                await self._wake.wait()
            self._wake.clear()  # work submitted from now on wakes the next iteration
            try:
                busy = await self._step()
            except Exception as exc:  # a failed step must not kill the instance: fail its requests
                log.exception("%s: step failed", self.spec.name)
                self._fail_submissions(exc)
                self._active.clear()
                self._woken.clear()
                self._busy.clear()
                self.on_step(StepDone(self.spec.name, -1, (), self.sim_now_s, 0.0, 0.0, repr(exc)))
                busy = False

    async def _step(self) -> bool:
        started, wall = time.monotonic(), now_s()
        self._flight = self._late()
        called = sorted(self._active - self._behind.keys() - self._flight.keys())
        self._woken.difference_update(called)  # a wake from now on lands during the gather
        calls = {r: self._call(r) for r in called}
        self._flight.update(calls)
        if calls:
            await self._gather(calls)
            observe(self.metrics, f"{self.spec.role}_step", wall)
        steps = [IDLE] * len(self.ranks)
        for r, call in self._flight.items():
            if r not in self._behind and not self._failed_alone(r, call):
                steps[r] = self._answered(r, call)
        self._flight = {}
        self._observe_idle(steps)
        if not any(s.batch.num_seqs for s in steps):
            return bool(self._active - self._behind.keys())
        cost = self.price(StepBatch(tuple(s.batch for s in steps)))
        pace = await sleep_paced(cost.total_s, self.time_scale, started)
        self.sim_now_s += cost.total_s
        self.pacing_lag_s += pace.lag_s
        self._record_tokens(steps)
        for r, step in enumerate(steps):
            self._record(r, step, cost, pace.lag_s)
            if step.emitted:
                self.on_step(
                    StepDone(
                        self.spec.name, r, step.emitted, self.sim_now_s, cost.total_s, pace.lag_s
                    )
                )
        # Unpaced, nothing above awaits: without this the streams woken by the step's tokens
        # would run only once the next step's Ray call is out (~0.4-0.7 ms later on the first
        # token's path, bench/notes/frontdoor_stages.md).
        await asyncio.sleep(0)
        return bool(self._active - self._behind.keys())

    def _observe_idle(self, steps: list[RankStep]) -> None:
        """Each rank's state from here on: requests or none (a rank left behind is counted busy),
        some waiting or none (what its answer said)."""
        if self.idle is None:
            return
        states = {
            key: (r in self._active or r in self._behind or bool(self._inbox.get(r)), steps[r].waiting > 0)
            for r, key in enumerate(self._keys)
        }
        self.idle.observe(self.sim_now_s, states)

    def _call(self, r: int) -> _Call:
        """Rank r's step call, carrying the submissions queued for it."""
        queued = self._inbox.pop(r, [])
        inbox = tuple(s for s, _ in queued)
        ref = self.ranks[r].step.remote(inbox) if inbox else self.ranks[r].step.remote()
        return _Call(asyncio.ensure_future(ref), tuple(f for _, f in queued))

    async def _gather(self, calls: dict[int, _Call]) -> None:
        """Wait for every rank in lockstep, however long; a rank joining the step (idle before)
        that is still silent after JOIN_GRACE_S and the others is left behind. A failed call of a
        rank in lockstep fails the step."""
        await asyncio.wait([c.task for c in calls.values()], timeout=JOIN_GRACE_S)
        members = [c.task for r, c in calls.items() if r in self._busy]
        if members:
            await asyncio.wait(members)
        pending = {r: c for r, c in calls.items() if not c.task.done()}
        while pending and not self._others_waiting(calls, pending):  # nobody needs a step yet
            await asyncio.wait([c.task for c in pending.values()], timeout=LEAVE_POLL_S)
            pending = {r: c for r, c in pending.items() if not c.task.done()}
        for r, call in pending.items():
            log.warning("%s/%d: no answer within %.1f s; left behind", self.spec.name, r,
                        JOIN_GRACE_S)
            self._behind[r] = call
            call.task.add_done_callback(lambda _task, r=r: self._came_back(r))
        for r, call in calls.items():
            if r in self._busy and call.task.done() and call.task.exception() is not None:
                raise call.task.exception()  # type: ignore[misc]

    def _failed_alone(self, r: int, call: _Call) -> bool:
        """A rank that joined the step (it was idle: its siblings never waited on it) and failed
        fails only its own requests, as a refused admission would."""
        exc = call.task.exception()
        if exc is None:
            return False
        self._fail_rank(r, call, exc)
        return True

    def _others_waiting(self, calls: dict[int, _Call], pending: dict[int, _Call]) -> bool:
        """Another rank needs the next step: it answered busy, was given work since, or came
        back after being left behind."""
        busy = any(
            c.task.done() and c.task.exception() is None and c.task.result().busy
            for r, c in calls.items()
            if r not in pending
        )
        given = (self._woken | self._inbox.keys()) - pending.keys()
        return busy or bool(given) or any(c.task.done() for c in self._behind.values())

    def _came_back(self, r: int) -> None:
        self._active.add(r)  # its late answer is taken by the next step
        self._wake.set()

    def _late(self) -> dict[int, _Call]:
        """The calls of ranks left behind that have answered since: they count in this step."""
        late = {r: c for r, c in self._behind.items() if c.task.done()}
        for r, call in list(late.items()):
            del self._behind[r]
            if call.task.exception() is not None:
                del late[r]
                self._fail_rank(r, call, call.task.exception())  # type: ignore[arg-type]
        return late

    def _fail_rank(self, r: int, call: _Call, exc: BaseException) -> None:
        """A rank that joined a step, or was left behind, failed (its actor died): only its own
        requests fail, since its siblings never waited on it."""
        log.error("%s/%d: step failed: %r", self.spec.name, r, exc)
        for future in call.futures:
            if not future.done():
                future.set_exception(RuntimeError(f"{self.spec.name}/{r}: {exc!r}"))
        self._busy.discard(r)
        self._woken.discard(r)
        if not self._inbox.get(r):
            self._active.discard(r)  # not called again until it is given work
        self.on_step(StepDone(self.spec.name, r, (), self.sim_now_s, 0.0, 0.0, repr(exc)))

    def _answered(self, r: int, call: _Call) -> RankStep:
        """Rank r's answer: its submissions' results, its time, whether it stays in the loop."""
        step: RankStep = call.task.result()
        for future, result in zip(call.futures, step.admitted, strict=False):
            if not future.done():
                future.set_result(result)
        for future in call.futures[len(step.admitted) :]:  # an answer without them: refused
            if not future.done():
                future.set_result(AdmitResult("", None, FAILED, "the rank did not admit it"))
        record(self.metrics, f"{self.spec.role}_rank_step", step.wall_s)
        if call.futures:  # the call carried admissions: their share of the rank's time
            record(self.metrics, f"{self.spec.role}_rank_admit", step.admit_s)
        if step.busy:
            self._busy.add(r)
        else:
            self._busy.discard(r)
        if not step.busy and r not in self._woken and not self._inbox.get(r):
            self._active.discard(r)  # idle, and nothing submitted since
        return step

    def _fail_submissions(self, exc: Exception) -> None:
        """A failed step fails every submission of the instance: those it carried, those queued."""
        futures = [f for c in self._flight.values() for f in c.futures]
        futures += [f for queued in self._inbox.values() for _, f in queued]
        self._flight, self._inbox = {}, {}
        for future in futures:
            if not future.done():
                future.set_exception(RuntimeError(f"{self.spec.name}: {exc!r}"))

    def _record(self, r: int, step: RankStep, cost: StepCost, lag_s: float) -> None:
        key = self._keys[r]
        busy = cost.rank_busy_s[r] if r < len(cost.rank_busy_s) else cost.total_s
        self.metrics.ranks.record_step(
            key, busy, max(0.0, cost.total_s - busy), step.batch.num_seqs
        )
        self.metrics.ranks.record_pacing(key, lag_s)
        if step is IDLE:  # not called this step: its last reported state still holds
            return
        if step.preemptions:
            self.metrics.observe_preemptions(key, step.preemptions)
        self.metrics.vllm.observe_iteration(key.engine, step.batch.total_new)
        self.metrics.observe_rank_state(
            key,
            step.batch.num_seqs,
            step.waiting,
            step.queued_prompt_tokens,
            step.kv_blocks_used,
            step.kv_blocks_total,
        )

    def _record_tokens(self, steps: list[RankStep]) -> None:
        """Computed prompt tokens (prefill) or sampled tokens (decode) of the step, per instance."""
        if self.spec.role == "prefill":
            counts = {"uncached": sum(s.batch.total_new for s in steps)}
        else:
            counts = {"output": sum(1 for s in steps for e in s.emitted if e.token is not None)}
        self.metrics.ranks.record_instance_tokens(self.spec.name, self.spec.role, counts)
