"""The base of the prefill and decode gRPC services: their instances, rank actors and lockstep
loops, the input check both apply, the Health answer (with the rank probe), and the rank gauges,
set every second from each rank's current state rather than from step deltas (a rank that went
idle or whose step failed would otherwise keep its last load on /metrics)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Container
from typing import ClassVar

import grpc

from rackserve.metrics import RankKey
from rackserve.model.logprobs import TokenLogprob
from services import rank_probe
from services._proto import prefill_pb2
from services.instance_loop import InstanceLoop, StepDone
from services.rank_inbox import INVALID, QUEUE_FULL, AdmitResult, Admitted
from services.rank_worker import RankState
from services.topology import InstanceSpec
from services.worker_host import Worker, make_loops

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
        self.loops: dict[str, InstanceLoop] = make_loops(worker, self.phase, self.on_step)
        self.states: dict[tuple[str, int], RankState] = {}  # each rank's last state report

    def on_step(self, done: StepDone) -> None:
        raise NotImplementedError

    async def Health(
        self, request: prefill_pb2.WorkerHealthRequest, context: grpc.aio.ServicerContext
    ) -> prefill_pb2.WorkerHealthReply:
        return prefill_pb2.WorkerHealthReply(
            ready=True,
            instances=list(self.specs),
            unresponsive=await rank_probe.unresponsive(self.actors),
            ranks=[rank_status(name, r, state) for (name, r), state in self.states.items()],
        )

    async def refresh_rank_state(self, interval_s: float = STATE_INTERVAL_S) -> None:
        """Forever: every rank's gauges from its `state()` (a rank that does not answer keeps
        its last values until it does)."""
        keys = [(name, r) for name, ranks in self.actors.items() for r in range(len(ranks))]
        while True:
            await asyncio.sleep(interval_s)
            states = await asyncio.gather(
                *(self._state(self.actors[n][r]) for n, r in keys), return_exceptions=True
            )
            for (name, r), state in zip(keys, states, strict=True):
                if isinstance(state, RankState):
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
