"""The official openai client against the live cluster: completions and chat, streamed or not."""

from __future__ import annotations

import math

import httpx
import openai
import pytest

pytestmark = pytest.mark.integration

MODEL = "rackserve-moe-small"
CHAT = [
    {"role": "system", "content": "You are the rack's twin."},
    {"role": "user", "content": "Describe the KV pool in one line."},
]


@pytest.fixture(scope="module")
def client(live_cluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_cluster.urls["OpenAI API"], api_key="unused", max_retries=0)


def test_models_health_ready(live_cluster) -> None:
    base = live_cluster.base_url
    assert httpx.get(f"{base}/health").json() == {"status": "ok"}
    assert httpx.get(f"{base}/ready").status_code == 200
    models = httpx.get(f"{base}/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]


def test_completion_stream_equals_non_stream(client: openai.OpenAI) -> None:
    prompt = "The twin of a rack serves tokens"
    full = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    assert full.object == "text_completion"
    assert full.usage.completion_tokens == 12 and full.choices[0].finish_reason == "length"
    assert full.usage.prompt_tokens == len(prompt.encode())
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert chunks[-1].usage.completion_tokens == 12
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_stream_equals_non_stream(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=10, temperature=0, extra_body={"ignore_eos": True}
    )
    assert full.object == "chat.completion"
    assert full.choices[0].message.role == "assistant"
    assert full.usage.completion_tokens == 10
    stream = client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=10,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == full.choices[0].message.content


def test_metrics_show_pacing_and_rank_time(live_cluster, client: openai.OpenAI) -> None:
    client.completions.create(model=MODEL, prompt="metrics please", max_tokens=4, temperature=0)
    body = httpx.get(f"{live_cluster.base_url}/metrics").text
    assert (
        'rackserve_rank_steps_total{dp_rank="0",instance="prefill-dep2-0",role="prefill"}' in body
    )
    assert 'instance="decode-wide-ep-0"' in body
    assert "rackserve_rank_idle_seconds_total" in body
    assert "rackserve_rank_pacing_lag_seconds_total" in body  # real numpy compute overruns 0.002 x
    assert "rackserve_time_to_first_token_seconds_count" in body
    assert "vllm:e2e_request_latency_seconds_count" in body


def test_logprobs_are_the_models_own_distribution(client: openai.OpenAI) -> None:
    """Greedy: every token is the model's most likely one, so its logprob heads top_logprobs;
    the alternatives are a proper distribution's (<= 0, summing to <= 1); streamed = not."""
    prompt = "The twin of a rack serves tokens"
    kwargs = dict(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, logprobs=3,
                  extra_body={"ignore_eos": True})
    lp = client.completions.create(**kwargs).choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 8
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert value <= 0 and len(top) == 3  # the sampled token is one of the top 3
        assert top[token] == pytest.approx(value) and value == pytest.approx(max(top.values()))
        assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-6
    streamed = [
        v for c in client.completions.create(**kwargs, stream=True) if c.choices
        for v in c.choices[0].logprobs.token_logprobs
    ]
    assert streamed == pytest.approx(lp.token_logprobs, abs=1e-5)


def test_chat_top_logprobs_and_n_choices(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2,
        n=2, extra_body={"ignore_eos": True},
    )
    assert [c.index for c in full.choices] == [0, 1]
    assert full.choices[0].message.content == full.choices[1].message.content  # greedy
    content = full.choices[0].logprobs.content
    assert len(content) == 6 and all(len(t.top_logprobs) == 2 for t in content)
    assert all(t.logprob == pytest.approx(t.top_logprobs[0].logprob) for t in content)
    assert full.usage.completion_tokens == 12
