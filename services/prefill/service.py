"""The Prefill gRPC service: queue a prompt on the (instance, DP rank) the router chose, wait for
the instance loop to finish it, answer with the first token, the KV handle and simulated times."""

from __future__ import annotations

import asyncio
from collections.abc import Container
from dataclasses import dataclass

import grpc
import ray

from rackserve.metrics import ProcessMetrics, RankKey
from rackserve.sched.scheduler import QueueFull
from services import rank_probe
from services._proto import prefill_pb2, prefill_pb2_grpc
from services.instance_loop import InstanceLoop, StepDone
from services.rank_worker import Admitted
from services.topology import InstanceSpec


@dataclass
class _Waiter:
    future: asyncio.Future
    instance: str
    submitted_sim_s: float
    started_sim_s: float | None = None
    lag_s: float = 0.0


def sampling_dict(params: prefill_pb2.SamplingParams) -> dict:
    """The wire SamplingParams as plain fields for the rank actor (0 seed stays a seed)."""
    return {
        "temperature": params.temperature,
        "top_p": params.top_p or 1.0,
        "seed": params.seed,
        "ignore_eos": params.ignore_eos,
        "max_tokens": max(1, params.max_tokens),
    }


async def call_actor(ref: ray.ObjectRef, context: grpc.aio.ServicerContext) -> object:
    """Await an actor call; a ValueError inside (bad input) becomes INVALID_ARGUMENT, a full rank
    queue (rackserve.sched.QueueFull) RESOURCE_EXHAUSTED."""
    try:
        return await ref
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, QueueFull):
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc.cause))
        if isinstance(exc.cause, ValueError):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc.cause))
        raise


def check_target(specs: dict[str, InstanceSpec], instance: str, rank: int) -> str | None:
    spec = specs.get(instance)
    if spec is None:
        return f"instance: unknown instance {instance!r}"
    if rank >= spec.dp_ranks:
        return f"dp_rank: {instance} has ranks 0..{spec.dp_ranks - 1}, got {rank}"
    return None


def check_request(
    specs: dict[str, InstanceSpec], instance: str, rank: int, token_ids: object, request_id: str,
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


class PrefillService(prefill_pb2_grpc.PrefillServicer):
    def __init__(
        self,
        specs: dict[str, InstanceSpec],
        actors: dict[str, list],
        loops: dict[str, InstanceLoop],
        model_id: str,
        block_size: int,
        metrics: ProcessMetrics,
    ) -> None:
        self.specs, self.actors, self.loops, self.metrics = specs, actors, loops, metrics
        self.model_id, self.block_size = model_id, block_size
        self._waiting: dict[str, _Waiter] = {}

    def on_step(self, done: StepDone) -> None:
        if done.error:
            for waiter in self._waiting.values():
                if waiter.instance == done.instance and not waiter.future.done():
                    waiter.future.set_exception(RuntimeError(f"{done.instance}: {done.error}"))
            return
        for e in done.emitted:
            waiter = self._waiting.get(e.request_id)
            if waiter is None:
                continue
            if waiter.started_sim_s is None:
                waiter.started_sim_s = done.sim_now_s - done.step_s
            waiter.lag_s += done.lag_s
            if e.finish_reason is not None and not waiter.future.done():
                waiter.future.set_result((e, done.sim_now_s))

    async def Prefill(
        self, request: prefill_pb2.PrefillRequest, context: grpc.aio.ServicerContext
    ) -> prefill_pb2.PrefillReply:
        problem = check_request(self.specs, request.instance, request.dp_rank, request.token_ids,
                                request.request_id, self._waiting)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        loop = self.loops[request.instance]
        actor = self.actors[request.instance][request.dp_rank]
        waiter = _Waiter(
            asyncio.get_running_loop().create_future(), request.instance, loop.sim_now_s
        )
        self._waiting[request.request_id] = waiter
        try:
            admitted = await call_actor(
                actor.submit_prefill.remote(
                    request.request_id, list(request.token_ids), sampling_dict(request.sampling)
                ),
                context,
            )
            loop.wake(request.dp_rank)
            self._record_lookup(request, admitted)
            emitted, finished_sim = await waiter.future
        except RuntimeError as exc:  # the instance's step failed
            actor.cancel.remote(request.request_id)
            await context.abort(grpc.StatusCode.INTERNAL, str(exc))
        finally:
            self._waiting.pop(request.request_id, None)
        started = waiter.started_sim_s if waiter.started_sim_s is not None else finished_sim
        hashes = list(emitted.kv_block_hashes)
        reused = emitted.reused or admitted  # what the engine started from, not what was found
        return prefill_pb2.PrefillReply(
            first_token=emitted.token,
            kv=prefill_pb2.KVHandle(
                model_id=self.model_id,
                block_size=self.block_size,
                block_hashes=hashes,
                num_tokens=len(hashes) * self.block_size,
            ),
            local_hit_tokens=reused.local_hit_tokens,
            pool_hit_tokens=reused.pool_hbm_tokens + reused.pool_dram_tokens,
            queue_sim_s=started - waiter.submitted_sim_s,
            prefill_sim_s=finished_sim - started,
            pacing_lag_s=waiter.lag_s,
            finish_reason="stop" if emitted.finish_reason == "stop" else "",
        )

    def _record_lookup(self, request: prefill_pb2.PrefillRequest, admitted: Admitted) -> None:
        """Where the prompt's KV came from, and its reused tokens, in this process's metrics."""
        found = {
            "rank_hbm": admitted.local_hit_tokens,
            "pool_hbm": admitted.pool_hbm_tokens,
            "pool_dram": admitted.pool_dram_tokens,
        }
        found["miss"] = len(request.token_ids) - sum(found.values())
        self.metrics.observe_prefix_lookup(
            RankKey(request.instance, request.dp_rank, "prefill"), found
        )
        self.metrics.ranks.record_instance_tokens(
            request.instance, "prefill", {"cached": len(request.token_ids) - found["miss"]}
        )

    async def Health(
        self, request: prefill_pb2.WorkerHealthRequest, context: grpc.aio.ServicerContext
    ) -> prefill_pb2.WorkerHealthReply:
        return prefill_pb2.WorkerHealthReply(
            ready=True,
            instances=list(self.specs),
            unresponsive=await rank_probe.unresponsive(self.actors),
        )
