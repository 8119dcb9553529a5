"""The lockstep loop of one engine instance: every step, every rank actor computes; the step lasts
as long as the slowest rank (the MoE dispatch is a barrier), paced by the cost model.

A step's wall time is max(real compute of all ranks, StepCost.total_s x time_scale). The loop
keeps the instance's simulated clock (the sum of its steps' simulated durations), which is what
every latency it reports is measured on; a rank's idle time is total_s - its busy time.
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
from services.rank_worker import Emitted, RankStep
from services.stage_timer import now_s, observe, record
from services.topology import InstanceSpec

log = logging.getLogger(__name__)


IDLE = RankStep(RankBatch.of([]), (), busy=False)  # a rank with nothing to do waits at the barrier


@dataclass(frozen=True)
class StepDone:
    """What the loop tells its service after a step: one rank's emissions at simulated time."""

    instance: str
    rank: int
    emitted: tuple[Emitted, ...]
    sim_now_s: float  # the instance's simulated clock at the end of the step
    step_s: float  # the step's simulated duration (it began at sim_now_s - step_s)
    lag_s: float
    error: str = ""  # set when the step failed: every request of the instance is failed


class InstanceLoop:
    """Owns one instance's rank actors; `wake()` after submitting work to any of them."""

    def __init__(
        self,
        spec: InstanceSpec,
        ranks: list,
        price: Callable[[StepBatch], StepCost],
        time_scale: float,
        metrics: ProcessMetrics,
        on_step: Callable[[StepDone], None],
    ) -> None:
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
        self._keys = [RankKey(spec.name, r, spec.role) for r in range(len(ranks))]
        metrics.ranks.declare_instance(spec.name, spec.role, spec.gpus)

    def wake(self, rank: int) -> None:
        """Work was submitted to `rank`: it takes part in the next step."""
        self._active.add(rank)
        self._woken.add(rank)
        self._wake.set()

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
                self._active.clear()
                self._woken.clear()
                self.on_step(StepDone(self.spec.name, -1, (), self.sim_now_s, 0.0, 0.0, repr(exc)))
                busy = False

    async def _step(self) -> bool:
        started, wall = time.monotonic(), now_s()
        called = sorted(self._active)
        self._woken.difference_update(called)  # a wake from now on lands during the gather
        results: list[RankStep] = await asyncio.gather(
            *(self.ranks[r].step.remote() for r in called)
        )
        observe(self.metrics, f"{self.spec.role}_step", wall)
        steps = [IDLE] * len(self.ranks)
        for r, step in zip(called, results, strict=True):
            steps[r] = step
            record(self.metrics, f"{self.spec.role}_rank_step", step.wall_s)
            if not step.busy and r not in self._woken:  # idle, and nothing submitted since
                self._active.discard(r)
        if not any(s.batch.num_seqs for s in steps):
            return bool(self._active)
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
        return bool(self._active)

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
