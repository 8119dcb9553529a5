"""The Prefill gRPC service: queue a prompt on the (instance, DP rank) the router chose, wait for
the instance loop to finish it, answer with the first token, the KV handle and simulated times."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc

from rackserve.metrics import RankKey
from services._proto import prefill_pb2, prefill_pb2_grpc
from services.instance_loop import StepDone
from services.kvpool.client import TIER_TO_PB
from services.rank_inbox import Admitted, Submission
from services.stage_timer import now_s, observe
from services.worker_host import Worker
from services.worker_service import (
    WorkerService,
    admission,
    check_request,
    logprob_pb,
    sampling_dict,
)


@dataclass
class _Waiter:
    future: asyncio.Future
    instance: str
    rank: int
    submitted_sim_s: float
    started_sim_s: float | None = None
    lag_s: float = 0.0


class PrefillService(WorkerService, prefill_pb2_grpc.PrefillServicer):
    phase = "prefill"

    def __init__(self, worker: Worker) -> None:
        super().__init__(worker)
        self.model_id, self.block_size = worker.cfg.engine.model_id, worker.cfg.engine.block_size
        self._waiting: dict[str, _Waiter] = {}

    def on_step(self, done: StepDone) -> None:
        if done.error:
            for waiter in self._waiting.values():
                if done.fails(waiter.instance, waiter.rank) and not waiter.future.done():
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

    def requests_on(self, instance: str) -> int:
        return sum(w.instance == instance for w in self._waiting.values())

    async def Prefill(
        self, request: prefill_pb2.PrefillRequest, context: grpc.aio.ServicerContext
    ) -> prefill_pb2.PrefillReply:
        problem = check_request(self.specs, request.instance, request.dp_rank, request.token_ids,
                                request.request_id, self._waiting)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        if request.instance not in self.loops:  # stopped by the planner: the router routes elsewhere
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"instance: {request.instance} is not running")
        loop = self.loops[request.instance]
        waiter = _Waiter(
            asyncio.get_running_loop().create_future(), request.instance, request.dp_rank,
            loop.sim_now_s,
        )
        self._waiting[request.request_id] = waiter
        started = now_s()
        finished = False
        try:
            # Admitted by the step call that computes it (services/rank_inbox.py): no Ray call of
            # its own; a rank that hangs is left behind by the loop, its siblings step on.
            submission = Submission(
                "prefill", request.request_id, tuple(request.token_ids),
                sampling_dict(request.sampling),
            )
            admitted = await admission(loop.submit(request.dp_rank, submission), context)
            observe(self.metrics, "prefill_admit", started)
            self._record_lookup(request, admitted)
            started = now_s()
            emitted, finished_sim = await waiter.future
            observe(self.metrics, "prefill_wait", started)
            finished = True
        except RuntimeError as exc:  # the instance's step failed, or the rank refused it
            await context.abort(grpc.StatusCode.INTERNAL, str(exc))
        finally:
            self._waiting.pop(request.request_id, None)
            if not finished:  # failed, refused, timed out or cancelled: the rank drops it
                loop.cancel(request.dp_rank, request.request_id)
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
                lease_id=emitted.kv_lease_id,
                block_tiers=[TIER_TO_PB[t] for t in emitted.kv_block_tiers],
            ),
            local_hit_tokens=reused.local_hit_tokens,
            pool_hit_tokens=reused.pool_hbm_tokens + reused.pool_dram_tokens,
            queue_sim_s=started - waiter.submitted_sim_s,
            prefill_sim_s=finished_sim - started,
            pacing_lag_s=waiter.lag_s,
            finish_reason="stop" if emitted.finish_reason == "stop" else "",
            first_logprob=logprob_pb(emitted.logprob),
            prompt_logprobs=[logprob_pb(lp) for lp in emitted.prompt_logprobs],
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
