"""One request's trip through the cluster: route, prefill on a DP rank, decode with streaming.

The front door calls `Orchestrator.generate`, which yields token lists as the decode rank streams
them and fills a `Trip` (services/router/trip.py) with where the request went and its simulated
latencies.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc

from rackserve.kv.block_hash import block_hashes
from rackserve.model.logprobs import TokenLogprob
from rackserve.routing.view import NoRankAvailable
from services._proto import decode_pb2, decode_pb2_grpc, prefill_pb2, prefill_pb2_grpc
from services.grpc_limits import RECONNECT_OPTIONS
from services.router import migration
from services.router.logprobs import logprob_of
from services.router.router_core import Route, RouterCore
from services.router.stream_errors import WorkerUnavailable
from services.router.trip import Sampling, Trip
from services.stage_timer import now_s, observe

__all__ = ["Orchestrator", "Sampling", "Trip"]


def sampling_pb(sampling: Sampling) -> prefill_pb2.SamplingParams:
    """A request's sampling settings as the wire message both its prefill and decode ranks get."""
    return prefill_pb2.SamplingParams(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        max_tokens=sampling.max_tokens,
        seed=sampling.seed,
        ignore_eos=sampling.ignore_eos,
        logprobs=sampling.top_logprobs is not None,
        top_logprobs=sampling.top_logprobs or 0,
        logit_bias=dict(sampling.logit_bias),
        min_tokens=sampling.min_tokens,
        frequency_penalty=sampling.frequency_penalty,
        presence_penalty=sampling.presence_penalty,
        repetition_penalty=sampling.repetition_penalty,
        prompt_logprobs=sampling.prompt_logprobs,
        prompt_tokens=sampling.prompt_tokens,
    )


class Orchestrator:
    """Routes with `RouterCore` and talks gRPC to the prefill and decode services."""

    def __init__(
        self,
        router: RouterCore,
        prefill_addr: str,
        decode_addr: str,
        model_id: str,
        block_size: int,
        worker_timeout_s: float | None = None,
        decode_chunk_timeout_s: float | None = None,
        time_scale: float = 0.0,
    ) -> None:
        self.time_scale = time_scale  # wall s per sim s: a failed call's wait in simulated s
        self.decode_chunk_timeout_s = decode_chunk_timeout_s  # a hung decode rank: migrate
        self.worker_timeout_s = worker_timeout_s  # a hung prefill rank: DEADLINE_EXCEEDED, re-route
        self.router = router
        self.model_id = model_id
        self.block_size = block_size
        self._prefill_channel = grpc.aio.insecure_channel(prefill_addr, options=RECONNECT_OPTIONS)
        self._decode_channel = grpc.aio.insecure_channel(decode_addr, options=RECONNECT_OPTIONS)
        self._prefill = prefill_pb2_grpc.PrefillStub(self._prefill_channel)
        self._decode = decode_pb2_grpc.DecodeStub(self._decode_channel)

    async def close(self) -> None:
        await self._prefill_channel.close()
        await self._decode_channel.close()

    def connected(self, role: str) -> bool:
        """The channel requests to the `role` service take is connected (an idle one is told to
        connect, and counts as not connected until it is)."""
        channel = self._prefill_channel if role == "prefill" else self._decode_channel
        return channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY

    async def worker_health(self, role: str, timeout_s: float) -> prefill_pb2.WorkerHealthReply:
        """The `role` service's Health, over the channel its requests take."""
        stub = self._prefill if role == "prefill" else self._decode
        return await stub.Health(prefill_pb2.WorkerHealthRequest(), timeout=timeout_s)

    async def scale(self, role: str, instance: str, run: bool, timeout_s: float) -> prefill_pb2.ScaleReply:
        """Start (run) or stop `instance` on the `role` service (the planner's hand)."""
        stub = self._prefill if role == "prefill" else self._decode
        return await stub.Scale(prefill_pb2.ScaleRequest(instance=instance, run=run), timeout=timeout_s)

    async def generate(
        self, trip: Trip, prompt: list[int], sampling: Sampling
    ) -> AsyncIterator[list[int]]:
        """Yield the generated tokens chunk by chunk; `trip` holds the accounting at the end.
        The request's load is booked on both its ranks at the routing decision (RouterCore)."""
        started = now_s()
        hashes = block_hashes(prompt, self.block_size, self.model_id)
        try:
            decision = self.router.route(trip.request_id, prompt, hashes, sampling.max_tokens)
        except NoRankAvailable as exc:
            raise WorkerUnavailable.from_no_rank(exc) from exc
        observe(self.router.metrics, "route", started)
        try:
            async for tokens in self._serve(trip, prompt, sampling, decision):
                yield tokens
        finally:
            self.router.release(decision)

    async def _serve(
        self, trip: Trip, prompt: list[int], sampling: Sampling, decision: Route
    ) -> AsyncIterator[list[int]]:
        trip.prefill = f"{decision.prefill_instance}/{decision.prefill_rank}"
        trip.decode = f"{decision.decode_instance}/{decision.decode_rank}"
        trip.predicted_hit_tokens = decision.predicted_hit_tokens
        params = sampling_pb(sampling)
        sent_at, started = time.monotonic(), now_s()
        reply = await self._prefill_call(trip, prompt, params, decision)
        if reply is None:
            self.router.release(decision)  # the new route books its own ranks
            waited_s = migration.sim_wait_s(time.monotonic() - sent_at, self.time_scale)
            async for tokens in migration.reroute_prefill(
                self, trip, prompt, sampling, decision, waited_s
            ):
                yield tokens
            return
        observe(self.router.metrics, "prefill_call", started)
        self._account_prefill(trip, reply)
        self.router.record_delivery(decision, trip.cached_tokens)
        first_logprob = logprob_of(reply.first_logprob) if reply.HasField("first_logprob") else None
        if reply.finish_reason or sampling.max_tokens == 1:  # the first token ends it: no decode
            trip.token_times_s.append(trip.queue_s + trip.prefill_s)
            trip.completion_tokens = 1
            trip.output_ids.append(reply.first_token)
            trip.logprobs.append(first_logprob)
            trip.finish_reason = reply.finish_reason or "length"
            yield [reply.first_token]
            return
        request = decode_pb2.DecodeRequest(
            request_id=trip.request_id,
            instance=decision.decode_instance,
            rank=decision.decode_rank,
            token_ids=prompt,
            first_token=reply.first_token,
            kv=reply.kv,
            sampling=params,
        )
        failed = hung = False
        call, started = self._decode.Generate(request), now_s()
        try:
            while (chunk := await self._next_chunk(call)) is not grpc.aio.EOF:
                if not trip.token_times_s:
                    observe(self.router.metrics, "decode_first_chunk", started)
                self._account_chunk(trip, chunk, first_logprob)
                yield list(chunk.token_ids)
        except grpc.aio.AioRpcError as exc:  # the decode rank failed: continue elsewhere
            if exc.code() in migration.NOT_MIGRATED:
                raise
            if not migration.within_budget(trip.request_id):
                raise WorkerUnavailable("decode") from exc
            failed = True
        except TimeoutError as exc:  # the decode rank hangs: cancel, continue elsewhere
            if not migration.within_budget(trip.request_id):
                raise WorkerUnavailable("decode", timed_out=True) from exc
            failed = hung = True
        finally:
            call.cancel()
        if failed:
            self.router.release(decision)
            async for tokens in migration.migrate(self, trip, prompt, sampling, decision, hung):
                yield tokens

    async def _prefill_call(
        self, trip: Trip, prompt: list[int], params: prefill_pb2.SamplingParams, decision: Route
    ) -> prefill_pb2.PrefillReply | None:
        """The prefill rank's reply, or None when it failed and the request may go elsewhere;
        its booked prefill load is released either way."""
        try:
            return await self._prefill.Prefill(
                prefill_pb2.PrefillRequest(
                    request_id=trip.request_id,
                    instance=decision.prefill_instance,
                    dp_rank=decision.prefill_rank,
                    token_ids=prompt,
                    sampling=params,
                ),
                timeout=self.worker_timeout_s,
            )
        except grpc.aio.AioRpcError as exc:  # the prefill rank failed: route elsewhere
            if exc.code() in migration.NOT_MIGRATED:
                raise
            if not migration.within_budget(trip.request_id):
                raise WorkerUnavailable("prefill") from exc
            return None
        finally:
            self.router.release(decision, ("prefill",))

    async def _next_chunk(self, call: grpc.aio.UnaryStreamCall) -> decode_pb2.TokenChunk:
        """The stream's next chunk or EOF; TimeoutError after `decode_chunk_timeout_s` of silence."""
        async with asyncio.timeout(self.decode_chunk_timeout_s):  # no task per chunk (wait_for)
            return await call.read()

    def _account_prefill(self, trip: Trip, reply: prefill_pb2.PrefillReply) -> None:
        if reply.prompt_logprobs:  # asked (echo + logprobs): the first prompt token has none
            trip.prompt_logprobs = [None, *(logprob_of(lp) for lp in reply.prompt_logprobs)]
        trip.local_hit_tokens = reply.local_hit_tokens
        trip.pool_hit_tokens = reply.pool_hit_tokens
        trip.queue_s = max(0.0, reply.queue_sim_s)  # float sums of the same steps
        trip.prefill_s = max(0.0, reply.prefill_sim_s)
        trip.pacing_lag_s += reply.pacing_lag_s

    def _account_chunk(
        self, trip: Trip, chunk: decode_pb2.TokenChunk, first_logprob: TokenLogprob | None
    ) -> None:
        start = trip.queue_s + trip.prefill_s
        logprobs = [logprob_of(lp) for lp in chunk.logprobs]
        if not trip.token_times_s:  # the first chunk carries the prefill's token
            trip.kv_transfer_s = chunk.kv_load_sim_s
            trip.first_decode_s = max(0.0, chunk.sim_time_s - chunk.kv_load_sim_s)
            logprobs.insert(0, first_logprob)
        trip.logprobs.extend(logprobs + [None] * (len(chunk.token_ids) - len(logprobs)))
        trip.token_times_s.extend([start + chunk.sim_time_s] * len(chunk.token_ids))
        trip.completion_tokens += len(chunk.token_ids)
        trip.output_ids.extend(chunk.token_ids)
        trip.decode_s = chunk.sim_time_s
        trip.pacing_lag_s += chunk.pacing_lag_s
        if chunk.finish_reason:
            trip.finish_reason = chunk.finish_reason
