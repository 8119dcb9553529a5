"""The OpenAI surface as vLLM serves it, through the official openai client: logprobs and
top_logprobs (completions and chat, streamed or not), n > 1 choices, and stream_options without
stream refused with 400. The router's own app over real gRPC to fake workers whose every token
has a known logprob (tests/integration/router/front_door.py); the live cluster's real-model
logprobs are in tests/integration/cluster/test_openai_api.py."""

from __future__ import annotations

from contextlib import asynccontextmanager

import httpx
import openai
import pytest

from tests.integration.router.front_door import FAKE_LOGPROB, front_door


@asynccontextmanager
async def client():
    async with front_door() as (http, _, model):
        transport = http._transport  # the router app's ASGI transport
        async with httpx.AsyncClient(transport=transport, base_url="http://front-door/v1") as h:
            yield openai.AsyncOpenAI(base_url="http://front-door/v1", api_key="x",
                                     http_client=h, max_retries=0), model


async def test_completion_logprobs_streamed_and_not() -> None:
    async with client() as (api, model):
        reply = await api.completions.create(
            model=model, prompt="hi", max_tokens=4, logprobs=1, temperature=0
        )
        stream = await api.completions.create(
            model=model, prompt="hi", max_tokens=4, logprobs=1, stream=True, temperature=0
        )
        chunks = [c async for c in stream]
    lp = reply.choices[0].logprobs
    assert reply.choices[0].text == "ABCD"
    assert lp.tokens == ["A", "B", "C", "D"]
    assert lp.token_logprobs == pytest.approx([FAKE_LOGPROB.logprob] * 4)
    assert lp.top_logprobs[1] == pytest.approx({"B": -0.25})  # sampled 'B' is the alternative
    assert lp.top_logprobs[0] == pytest.approx({"B": -0.25, "A": -0.5})
    assert lp.text_offset == [0, 1, 2, 3]
    streamed = [t for c in chunks for t in (c.choices[0].logprobs.tokens if c.choices else [])]
    assert streamed == lp.tokens


async def test_chat_logprobs_and_top_logprobs() -> None:
    messages = [{"role": "user", "content": "hi"}]
    async with client() as (api, model):
        reply = await api.chat.completions.create(
            model=model, messages=messages, max_tokens=3, logprobs=True, top_logprobs=1,
            temperature=0,
        )
        stream = await api.chat.completions.create(
            model=model, messages=messages, max_tokens=3, logprobs=True, top_logprobs=1,
            stream=True, temperature=0,
        )
        chunks = [c async for c in stream]
        with pytest.raises(openai.BadRequestError, match="top_logprobs"):
            await api.chat.completions.create(model=model, messages=messages, top_logprobs=2)
    content = reply.choices[0].logprobs.content
    assert [c.token for c in content] == ["A", "B", "C"]
    assert content[0].logprob == pytest.approx(-0.5) and content[0].bytes == [65]
    assert [(t.token, t.logprob) for t in content[0].top_logprobs] == [("B", pytest.approx(-0.25))]
    streamed = [t.token for c in chunks if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content]
    assert streamed == ["A", "B", "C"]


async def test_n_choices_sample_with_their_own_seeds() -> None:
    async with client() as (api, model):
        reply = await api.completions.create(
            model=model, prompt="hi", max_tokens=3, n=2, temperature=1.0, seed=4
        )
        stream = await api.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3, n=3,
            stream=True, seed=4, stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
    assert [c.index for c in reply.choices] == [0, 1]
    assert [c.text for c in reply.choices] == ["ABC", "Abc"]  # seed 4 and seed 5
    assert reply.usage.completion_tokens == 6 and reply.usage.prompt_tokens > 0
    texts = {i: "" for i in range(3)}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == {0: "ABC", 1: "Abc", 2: "ABC"}
    assert chunks[-1].usage.completion_tokens == 9


async def test_stream_options_without_stream_is_400() -> None:
    async with client() as (api, model):
        with pytest.raises(openai.BadRequestError) as err:
            await api.completions.create(
                model=model, prompt="hi", max_tokens=2, stream_options={"include_usage": True}
            )
    assert "Stream options can only be defined when `stream=True`." in str(err.value)
