"""Many streams at once: continuous batching on the decode ranks serves every one to its length."""

from __future__ import annotations

import asyncio

import openai
import pytest

pytestmark = pytest.mark.integration

MODEL = "rackserve-moe-small"


async def one_stream(client: openai.AsyncOpenAI, i: int, n: int) -> tuple[int, int, str]:
    stream = await client.completions.create(
        model=MODEL,
        prompt=f"request {i}: " + "tokens " * (i % 7),
        max_tokens=n,
        temperature=0.8,
        seed=i,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    usage, finish = None, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
    return i, usage.completion_tokens, finish


def test_32_concurrent_streams_complete_with_their_token_counts(live_cluster) -> None:
    lengths = [4 + (i % 5) * 3 for i in range(32)]

    async def run() -> list[tuple[int, int, str]]:
        client = openai.AsyncOpenAI(
            base_url=live_cluster.urls["OpenAI API"], api_key="unused", max_retries=0, timeout=300
        )
        try:
            return await asyncio.gather(*(one_stream(client, i, n) for i, n in enumerate(lengths)))
        finally:
            await client.close()

    results = asyncio.run(run())
    assert [(i, tokens, finish) for i, tokens, finish in results] == [
        (i, n, "length") for i, n in enumerate(lengths)
    ]
