"""The benchmark loop: issue a workload's requests at their (scaled) arrival times, honour the
concurrency limit, feed completions back to closed-loop sources, stop cleanly on Ctrl-C.

Arrivals are in simulated seconds; a request due at `t` is sent at wall `t * time_scale` after the
start. An unpaced cluster (time_scale 0) has no simulated clock: arrivals are then wall seconds, as
in `vllm bench serve`. `duration_s` (same clock as arrivals) stops new requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from rackserve.workload.request import Request
from services.bench.outcome import Outcome
from services.bench.workload import BenchWorkload

Send = Callable[[Outcome, list[int]], Awaitable[Outcome]]


@dataclass
class RunResult:
    outcomes: list[Outcome]
    wall_duration_s: float
    interrupted: bool
    max_in_flight: int = 0


@dataclass
class _State:
    t0: float
    outcomes: list[Outcome] = field(default_factory=list)
    tasks: set[asyncio.Task] = field(default_factory=set)
    in_flight: int = 0
    max_in_flight: int = 0


class Runner:
    def __init__(self, workload: BenchWorkload, send: Send, time_scale: float, *,
                 concurrency: int | None = None, duration_s: float | None = None,
                 on_done: Callable[[Outcome], None] | None = None) -> None:  # fmt: skip
        if concurrency is not None and concurrency < 1:
            raise ValueError(f"concurrency: must be >= 1, got {concurrency}")
        self.workload = workload
        self.send = send
        self.wall_per_sim = time_scale if time_scale > 0 else 1.0  # unpaced: schedule in wall s
        self.duration_s = duration_s
        self.on_done = on_done or (lambda _o: None)
        self.sem = asyncio.Semaphore(concurrency) if concurrency else None
        self.stop = asyncio.Event()

    def sim_now(self, st: _State) -> float:
        elapsed = time.monotonic() - st.t0
        return elapsed / self.wall_per_sim

    async def run(self) -> RunResult:
        st = _State(time.monotonic())
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGINT, self.stop.set)
        try:
            for req in self.workload.source.start():
                self._spawn(st, req)
            while st.tasks and not self.stop.is_set():
                stopper = asyncio.ensure_future(self.stop.wait())
                await asyncio.wait({*st.tasks, stopper}, return_when=asyncio.FIRST_COMPLETED)
                stopper.cancel()
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGINT)
            interrupted = self.stop.is_set() and bool(st.tasks)
            for task in list(st.tasks):
                task.cancel()
            await asyncio.gather(*st.tasks, return_exceptions=True)
        return RunResult(st.outcomes, time.monotonic() - st.t0, interrupted, st.max_in_flight)

    def _spawn(self, st: _State, req: Request) -> None:
        if self.duration_s is not None and req.arrival_s >= self.duration_s:
            return
        task = asyncio.create_task(self._one(st, req))
        st.tasks.add(task)
        task.add_done_callback(st.tasks.discard)

    async def _one(self, st: _State, req: Request) -> None:
        delay = req.arrival_s * self.wall_per_sim - (time.monotonic() - st.t0)
        if delay > 0:
            await asyncio.sleep(delay)
        async with self.sem if self.sem is not None else contextlib.nullcontext():
            out = Outcome(req.req_id, req.prompt_tokens, req.output_tokens, session=req.session,
                          warmup=req.warmup, arrival_s=req.arrival_s)  # fmt: skip
            st.in_flight += 1
            st.max_in_flight = max(st.max_in_flight, st.in_flight)
            try:
                await self.send(out, self.workload.prompt_of(req))
            finally:
                st.in_flight -= 1
        st.outcomes.append(out)
        self.on_done(out)
        if self.stop.is_set():
            return
        for nxt in self.workload.source.on_done(req, self.sim_now(st)):
            self._spawn(st, nxt)
