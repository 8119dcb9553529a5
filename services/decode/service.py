"""The Decode gRPC service: a request joins a Wide-EP or TP8 rank after a P->D hand-off and its
tokens stream back as the instance loop steps (continuous batching inside each rank actor).

Simulated times per request: the P->D transfer of its pooled KV (cost model), then the instance's
clock. The prefill's first token is released when the request first runs in a decode step (its KV
is loaded and it has joined the batch); each later token when the step that sampled it ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from services._proto import decode_pb2, decode_pb2_grpc
from services.instance_loop import StepDone
from services.kvpool.client import PB_TO_TIER
from services.rank_inbox import Submission
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
class _Stream:
    instance: str
    rank: int
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    submitted_sim_s: float = 0.0


class DecodeService(WorkerService, decode_pb2_grpc.DecodeServicer):
    phase = "decode"

    def __init__(self, worker: Worker) -> None:
        super().__init__(worker)
        self.timing = worker.timing
        self._streams: dict[str, _Stream] = {}

    def on_step(self, done: StepDone) -> None:
        if done.error:
            for stream in self._streams.values():
                if done.fails(stream.instance, stream.rank):
                    stream.queue.put_nowait((None, done))
            return
        for e in done.emitted:
            stream = self._streams.get(e.request_id)
            if stream is not None:
                stream.queue.put_nowait((e, done))

    def requests_on(self, instance: str) -> int:
        return sum(st.instance == instance for st in self._streams.values())

    async def Generate(
        self, request: decode_pb2.DecodeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[decode_pb2.TokenChunk]:
        problem = check_request(self.specs, request.instance, request.rank, request.token_ids,
                                request.request_id, self._streams)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        if request.instance not in self.loops:  # stopped by the planner: the router routes elsewhere
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"instance: {request.instance} is not running")
        loop = self.loops[request.instance]
        stream = _Stream(request.instance, request.rank, submitted_sim_s=loop.sim_now_s)
        self._streams[request.request_id] = stream
        finished = False
        started = now_s()
        try:
            submission = Submission(  # rides on the rank's next step call (services/rank_inbox.py)
                "decode",
                request.request_id,
                tuple(request.token_ids),
                sampling_dict(request.sampling),
                request.first_token,
                tuple(request.kv.block_hashes),
                request.kv.lease_id,
                tuple(PB_TO_TIER[t] or "" for t in request.kv.block_tiers),
            )
            try:
                await admission(loop.submit(request.rank, submission), context)
            except RuntimeError as exc:  # the step failed, or the rank refused it
                await context.abort(grpc.StatusCode.INTERNAL, str(exc))
            observe(self.metrics, "decode_admit", started)
            started = now_s()
            transfer = self._transfer_s(request)
            first = True
            while not finished:
                emitted, done = await stream.queue.get()
                if emitted is None:  # the instance's step failed
                    await context.abort(grpc.StatusCode.INTERNAL, f"{done.instance}: {done.error}")
                since = done.sim_now_s - stream.submitted_sim_s + transfer
                # The target's decode rank samples token 1 in its first step (recomputing the
                # prompt's tail), so token k lands at the end of decode step k; the twin got token 1
                # from its prefill and samples token k+1 in step k, so each of its tokens is
                # reported one step (priced as the step just run) later. TTFT = queue + prefill +
                # transfer + first decode step, as in the simulator.
                if first:
                    observe(self.metrics, "decode_first_step", started)
                    yield decode_pb2.TokenChunk(
                        token_ids=[request.first_token],
                        kv_load_sim_s=transfer,
                        sim_time_s=since,
                    )
                    first = False
                finished = emitted.finish_reason is not None
                logprob = logprob_pb(emitted.logprob)
                yield decode_pb2.TokenChunk(
                    token_ids=[emitted.token] if emitted.token is not None else [],
                    sim_time_s=since + done.step_s,
                    finish_reason=emitted.finish_reason or "",
                    pacing_lag_s=done.lag_s,
                    logprobs=[logprob] if logprob is not None else [],
                )
        finally:
            self._streams.pop(request.request_id, None)
            if not finished:
                loop.cancel(request.rank, request.request_id)

    def _transfer_s(self, request: decode_pb2.DecodeRequest) -> float:
        """Simulated seconds to move the prompt's KV to the decode rank (the target moves all of it;
        the twin moves full blocks and recomputes the tail, which the step's cost charges)."""
        return self.timing.pd_transfer_s(len(request.token_ids))
