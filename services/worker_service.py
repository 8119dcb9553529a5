"""The base of the prefill and decode gRPC services: their instances, rank actors and lockstep
loops, the input check both apply, the Health answer (with the rank probe), and the rank gauges,
set every second from each rank's current state rather than from step deltas (a rank that went
idle or whose step failed would otherwise keep its last load on /metrics)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Container
from typing import ClassVar

import grpc

from rackserve.metrics import RankKey
from rackserve.model.logprobs import TokenLogprob
from services import rank_probe
from services._proto import prefill_pb2
from services.instance_loop import InstanceLoop, StepDone
from services.rank_idle import RankIdleExport
from services.rank_inbox import INVALID, QUEUE_FULL, AdmitResult, Admitted
from services.rank_worker import RankState
from services.step_memo import StepMemo
from services.topology import InstanceSpec
from services.worker_host import Worker, make_loop, stop_instance

log = logging.getLogger(__name__)
STATE_INTERVAL_S = 1.0  # how stale a rank gauge may be


def sampling_dict(params: prefill_pb2.SamplingParams) -> dict:
    """The wire SamplingParams as plain fields for the rank actor (0 seed stays a seed)."""
    return {
        "temperature": params.temperature,
        "top_p": params.top_p or 1.0,
        "seed": params.seed,
        "ignore_eos": params.ignore_eos,
        "max_tokens": max(1, params.max_tokens),
        "logprobs": params.logprobs,
        "top_logprobs": params.top_logprobs,
        "logit_bias": tuple(sorted(params.logit_bias.items())),
        "min_tokens": params.min_tokens,
        "frequency_penalty": params.frequency_penalty,
        "presence_penalty": params.presence_penalty,
        "repetition_penalty": params.repetition_penalty or 1.0,
        "prompt_logprobs": params.prompt_logprobs if params.HasField("prompt_logprobs") else None,
        "prompt_tokens": params.prompt_tokens,
    }


def logprob_pb(logprob: TokenLogprob | None) -> prefill_pb2.TokenLogprob | None:
    """A token's logprob (rackserve.model.logprobs) as the wire message; None stays None."""
    if logprob is None:
        return None
    return prefill_pb2.TokenLogprob(
        logprob=logprob.logprob,
        top_ids=[t for t, _ in logprob.top],
        top_logprobs=[v for _, v in logprob.top],
    )


async def admission(answer: asyncio.Future, context: grpc.aio.ServicerContext) -> Admitted:
    """Await a submission's answer (InstanceLoop.submit); bad input becomes INVALID_ARGUMENT, a
    full rank queue (rackserve.sched.QueueFull) RESOURCE_EXHAUSTED, any other refusal or a failed
    step a RuntimeError (INTERNAL: the router re-routes)."""
    result: AdmitResult = await answer
    if result.status == QUEUE_FULL:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, result.error)
    if result.status == INVALID:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, result.error)
    if result.admitted is None:
        raise RuntimeError(f"not admitted: {result.error}")
    return result.admitted


def check_target(specs: dict[str, InstanceSpec], instance: str, rank: int) -> str | None:
    spec = specs.get(instance)
    if spec is None:
        return f"instance: unknown instance {instance!r}"
    if rank >= spec.dp_ranks:
        return f"dp_rank: {instance} has ranks 0..{spec.dp_ranks - 1}, got {rank}"
    return None


def check_request(
    specs: dict[str, InstanceSpec],
    instance: str,
    rank: int,
    token_ids: object,
    request_id: str,
    active: Container[str],
) -> str | None:
    """What is wrong with a worker request (naming the field), or None: shared by prefill and decode."""
    problem = check_target(specs, instance, rank)
    if problem:
        return problem
    if not token_ids:
        return "token_ids: must not be empty"
    if request_id in active:
        return f"request_id: {request_id!r} is already running here"
    return None


def rank_status(instance: str, rank: int, state: RankState) -> prefill_pb2.RankStatus:
    return prefill_pb2.RankStatus(
        instance=instance, rank=rank, node=state.node, pid=state.pid, running=state.running,
        waiting=state.waiting, steps=state.steps, last_step_unix_s=state.last_step_unix_s,
    )


class WorkerService:
    """Subclasses set `phase` ("prefill" or "decode") and handle `on_step`."""

    phase: ClassVar[str]

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.specs, self.actors, self.metrics = worker.specs, worker.actors, worker.metrics
        self.memo = StepMemo(worker.timing)  # one per process: its instances share the memo
        keys = [key for spec in worker.specs.values() for key in spec.ranks()]
        self.idle = RankIdleExport(worker.metrics, keys)  # idle while its other ranks have waiting work
        self.loops: dict[str, InstanceLoop] = {name: self._loop(name) for name in worker.actors}
        self.loop_tasks: dict[str, asyncio.Task] = {}
        self.states: dict[tuple[str, int], RankState] = {}  # each rank's last state report
        self._scaling = asyncio.Lock()  # one start or stop at a time

    def _loop(self, name: str) -> InstanceLoop:
        return make_loop(self.worker, self.specs[name], self.phase, self.on_step, self.memo, self.idle)

    def run_loop(self, name: str) -> None:
        self.loop_tasks[name] = asyncio.get_running_loop().create_task(self.loops[name].run())

    def on_step(self, done: StepDone) -> None:
        raise NotImplementedError

    def requests_on(self, instance: str) -> int:
        """Requests this service holds on `instance` (admitted, not answered)."""
        raise NotImplementedError

    async def Health(
        self, request: prefill_pb2.WorkerHealthRequest, context: grpc.aio.ServicerContext
    ) -> prefill_pb2.WorkerHealthReply:
        actors = dict(self.actors)
        return prefill_pb2.WorkerHealthReply(
            ready=True,
            instances=list(actors),
            unresponsive=await rank_probe.unresponsive(actors),
            ranks=[rank_status(name, r, state) for (name, r), state in self.states.items() if name in actors],
        )

    async def Scale(
        self, request: prefill_pb2.ScaleRequest, context: grpc.aio.ServicerContext
    ) -> prefill_pb2.ScaleReply:
        """Start an instance's rank actors and its loop (run), or stop them (not run) once nothing
        is on it; both idempotent."""
        name = request.instance
        if name not in self.specs:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"instance: unknown instance {name!r}")
        started = time.monotonic()
        async with self._scaling:
            if request.run and name not in self.actors:
                self.actors[name] = await asyncio.to_thread(self.worker.spawn, self.specs[name])
                self.loops[name] = self._loop(name)
                self.run_loop(name)
                log.info("%s: started", name)
            elif not request.run and name in self.actors:
                held = self.requests_on(name)
                if held:
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                        f"instance: {name} still has {held} request(s); drain it first")
                ranks = self.actors.pop(name)
                self.loops.pop(name)
                task = self.loop_tasks.pop(name, None)
                if task is not None:
                    task.cancel()
                for r in range(len(ranks)):
                    self.states.pop((name, r), None)
                    self._observe(RankKey(name, r, self.specs[name].role), RankState(0, 0, 0, 0, 0))  # its gauges at 0
                await asyncio.to_thread(stop_instance, self.specs[name], ranks)
                log.info("%s: stopped", name)
        return prefill_pb2.ScaleReply(instance=name, running=name in self.actors, took_s=time.monotonic() - started)

    async def refresh_rank_state(self, interval_s: float = STATE_INTERVAL_S) -> None:
        """Forever: every running rank's gauges from its `state()` (a rank that does not answer
        keeps its last values until it does)."""
        while True:
            await asyncio.sleep(interval_s)
            actors = dict(self.actors)
            keys = [(name, r) for name, ranks in actors.items() for r in range(len(ranks))]
            states = await asyncio.gather(
                *(self._state(actors[n][r]) for n, r in keys), return_exceptions=True
            )
            for (name, r), state in zip(keys, states, strict=True):
                if isinstance(state, RankState) and name in self.actors:
                    self.states[(name, r)] = state
                    self._observe(RankKey(name, r, self.specs[name].role), state)

    async def _state(self, actor) -> RankState:
        return await asyncio.wait_for(actor.state.remote(), rank_probe.PROBE_TIMEOUT_S)

    def _observe(self, key: RankKey, state: RankState) -> None:
        self.metrics.observe_rank_state(
            key,
            state.running,
            state.waiting,
            state.queued_prompt_tokens,
            state.kv_blocks_used,
            state.kv_blocks_total,
        )
