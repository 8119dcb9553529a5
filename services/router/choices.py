"""The choices of one request (OpenAI's `n`): each its own trip through the cluster, run at once;
their text pieces, the logprobs each piece carries, and their streams merged into one.

Choice i samples with seed + i, so choices differ when sampling and are equal when greedy (as in
vLLM).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from services.router.detok import Detokenizer
from services.router.logprobs import chat_logprobs, completion_logprobs
from services.router.orchestrator import Orchestrator, Sampling, Trip

T = TypeVar("T")


@dataclass(frozen=True)
class Prepared:
    prompt: list[int]
    sampling: Sampling
    stops: list[str]


@dataclass(frozen=True)
class Piece:
    """A text delta of one choice; its output tokens are trip.output_ids[start:end]."""

    text: str
    finish: str | None
    start: int
    end: int


def trips(request_id: str, prompt_tokens: int, n: int) -> list[Trip]:
    """One trip per choice; with several, each routes under its own id."""
    if n == 1:
        return [Trip(request_id, prompt_tokens)]
    return [Trip(f"{request_id}-{i}", prompt_tokens) for i in range(n)]


def sampling_of(prep: Prepared, index: int) -> Prepared:
    return replace(prep, sampling=replace(prep.sampling, seed=(prep.sampling.seed + index) % 2**64))


async def run(orch: Orchestrator, trip: Trip, prep: Prepared) -> AsyncIterator[Piece]:
    """Yield the choice's pieces until it ends (the last one carries its finish_reason)."""
    detok = Detokenizer(prep.stops)
    gen = orch.generate(trip, prep.prompt, prep.sampling)
    start = end = 0
    try:
        async for tokens in gen:
            end += len(tokens)
            text = detok.push(tokens)
            if detok.stopped:
                trip.finish_reason = "stop"  # a stop string (matched here; the ranks never see it)
                yield Piece(text, "stop", start, end)
                return
            if text:
                yield Piece(text, None, start, end)
                start = end
        trip.finish_reason = trip.finish_reason or "length"
        yield Piece(detok.flush(), trip.finish_reason, start, end)
    finally:
        await gen.aclose()


def logprobs_of(
    trip: Trip, start: int, end: int, chat: bool, offset: int = 0, echo: Sequence[int] = ()
) -> dict:
    """The OpenAI logprobs object of the trip's output tokens [start, end), after those of the
    echoed prompt tokens `echo` (completions: the prompt's, when logprobs and echo are asked)."""
    ids = trip.output_ids[start:end]
    lps = _padded(trip.logprobs[start:end], len(ids))
    if chat:
        return chat_logprobs(ids, lps)
    if not echo:
        return completion_logprobs(ids, lps, offset)
    prompt = _padded(trip.prompt_logprobs, len(echo))
    return completion_logprobs([*echo, *ids], [*prompt, *lps], 0)


def _padded(lps: list, n: int) -> list:
    return lps + [None] * (n - len(lps))  # a request routed again fills them at its end


async def merge(streams: Sequence[AsyncIterator[T]]) -> AsyncIterator[T]:
    """Items of every stream interleaved as vLLM's n choices come, one step of each in turn: each
    stream runs ahead on a task of its own, the reader takes the next item of every live stream in
    order. The first failure met ends it (the rest are cancelled)."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield item
        return
    queues: list[asyncio.Queue] = [asyncio.Queue() for _ in streams]
    done = object()

    async def pump(stream: AsyncIterator[T], queue: asyncio.Queue) -> None:
        try:
            async for item in stream:
                await queue.put((item, None))
            await queue.put((done, None))
        except Exception as exc:  # handed to the consumer, which raises it
            await queue.put((done, exc))

    tasks = [asyncio.create_task(pump(s, q)) for s, q in zip(streams, queues, strict=True)]
    try:
        live = list(queues)
        while live:
            for queue in list(live):
                item, exc = await queue.get()
                if exc is not None:
                    raise exc
                if item is done:
                    live.remove(queue)
                    continue
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
