"""What a request's fields become at the front door: every sampling setting reaches the decode
rank on the wire, a fresh seed per unseeded request, echo's prompt logprobs, n > 1 streams
interleaved step by step, the fields not served refused by name, errors in the client's words,
and the model, version and health surfaces. The router's own app over real gRPC to fake workers
(tests/integration/router/front_door.py); the real model's effect of each setting is in
tests/unit/model/test_logits_processors.py and tests/integration/cluster/test_sampling_params.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.router.app import VERSION
from tests.integration.router.front_door import FAKE_LOGPROB, Decode, front_door

ROOT_PATH = str(Path(__file__).resolve().parents[3])


class Recording(Decode):
    """The fake decode rank, keeping each request's wire sampling settings."""

    def __init__(self) -> None:
        self.seen = []

    async def Generate(self, request, context):
        self.seen.append(request.sampling)
        async for chunk in super().Generate(request, context):
            yield chunk


def body(**fields) -> dict:
    return {"model": "rackserve-moe-small", "prompt": "hi", "max_tokens": 3, **fields}


async def test_sampling_settings_reach_the_decode_rank() -> None:
    rank = Recording()
    async with front_door(lambda core: rank) as (http, _, _):
        reply = await http.post("/v1/completions", json=body(
            logit_bias={"81": 100, "7": -2.5}, frequency_penalty=1.5, presence_penalty=-0.5,
            repetition_penalty=1.3, min_tokens=2, seed=11))
        assert reply.status_code == 200, reply.text
        for _ in range(2):
            assert (await http.post("/v1/completions", json=body(temperature=1))).status_code == 200
        assert (await http.post("/v1/completions", json=body(seed=11))).status_code == 200
    wire, unseeded, other, again = rank.seen
    assert dict(wire.logit_bias) == {81: 100.0, 7: -2.5}
    assert (wire.frequency_penalty, wire.presence_penalty) == (1.5, -0.5)
    assert wire.repetition_penalty == pytest.approx(1.3) and wire.min_tokens == 2
    assert not wire.ignore_eos  # min_tokens bans EOS in the engine, it does not ignore it
    assert wire.seed == again.seed == 11
    assert unseeded.seed != other.seed  # a fresh seed per unseeded request


async def test_echo_with_logprobs_gives_the_prompt_tokens_logprobs() -> None:
    async with front_door() as (http, _, _):
        reply = (await http.post("/v1/completions", json=body(
            echo=True, logprobs=1, max_tokens=2, temperature=0))).json()
        streamed = await http.post("/v1/completions", json=body(
            echo=True, logprobs=1, max_tokens=2, temperature=0, stream=True))
    choice = reply["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"] == "hiAB"
    assert lp["tokens"] == ["h", "i", "A", "B"] and lp["text_offset"] == [0, 1, 2, 3]
    assert lp["token_logprobs"] == [None, FAKE_LOGPROB.logprob, FAKE_LOGPROB.logprob,
                                    FAKE_LOGPROB.logprob]
    assert lp["top_logprobs"][0] is None and set(lp["top_logprobs"][1]) == {"i", "B"}
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines()
              if line.startswith("data: {")]
    tokens = [t for c in chunks for t in c["choices"][0]["logprobs"]["tokens"]]
    assert tokens == lp["tokens"]


async def test_n_choices_stream_interleaved_step_by_step() -> None:
    async with front_door() as (http, _, _):
        reply = await http.post("/v1/completions", json=body(
            n=2, max_tokens=5, stream=True, ignore_eos=True))
    chunks = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: {")]
    order = [c["choices"][0]["index"] for c in chunks if c["choices"]]
    assert order == [0, 1] * 6  # five tokens each, then each one's finish


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"suffix": "tail"}, "suffix", "fill-in-the-middle"),
        ({"best_of": 2}, "best_of", "best_of = n"),
        ({"response_format": {"type": "json_object"}}, "response_format", "text"),
        ({"logit_bias": {"x": 1}}, "logit_bias", "token id"),
        ({"logit_bias": {"5": 101}}, "logit_bias", "[-100, 100]"),
        ({"logit_bias": {"99999": 1}}, "logit_bias", "token id"),
        ({"min_tokens": 9}, "min_tokens", "max_tokens"),
        ({"max_tokens": True}, "max_tokens", "integer"),
        ({"temperature": "0.5"}, "temperature", "number"),
        ({"stop": [1]}, "stop", "string"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "up to 4"),
        ({"repetition_penalty": 0}, "repetition_penalty", "greater than 0"),
    ],
)
async def test_refusals_name_the_field_in_the_clients_words(fields, param, words) -> None:
    async with front_door() as (http, _, _):
        reply = await http.post("/v1/completions", json=body(**fields))
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"{param}: ") and words in error["message"]
    assert f"{param}: {param}" not in error["message"] and f"{param}." not in error["message"]


async def test_chat_content_of_the_wrong_type_names_the_message_field() -> None:
    chat = {"model": "rackserve-moe-small", "messages": [{"role": "user", "content": 5}]}
    async with front_door() as (http, _, _):
        reply = await http.post("/v1/chat/completions", json=chat)
    error = reply.json()["error"]
    assert reply.status_code == 400 and error["param"] == "messages.0.content"
    assert ".str" not in error["message"] and "function" not in error["message"]


@pytest.mark.parametrize(
    ("raw", "content_type", "words"),
    [
        (b"", "application/json", "empty"),
        (b"prompt=hi", "application/x-www-form-urlencoded", "must be JSON"),
        (b"just text", "text/plain", "must be JSON"),
        (b"{not json", "application/json", "not valid JSON"),
        (b"[1, 2]", "application/json", "JSON object"),
    ],
)
async def test_a_body_that_is_not_a_json_object_is_told_so(raw, content_type, words) -> None:
    async with front_door() as (http, _, _):
        reply = await http.post("/v1/completions", content=raw, headers={"content-type": content_type})
    assert reply.status_code == 400, reply.text
    assert words in reply.json()["error"]["message"]


async def test_nan_temperature_is_not_a_finite_number() -> None:
    raw = b'{"model": "rackserve-moe-small", "prompt": "hi", "temperature": NaN}'
    async with front_door() as (http, _, _):
        reply = await http.post("/v1/completions", content=raw,
                                headers={"content-type": "application/json"})
    error = reply.json()["error"]
    assert reply.status_code == 400 and error["param"] == "temperature"
    assert "finite" in error["message"] and "less than" not in error["message"]


async def test_best_of_equal_to_n_is_served() -> None:
    async with front_door() as (http, _, _):
        reply = await http.post("/v1/completions", json=body(best_of=2, n=2))
    assert reply.status_code == 200 and len(reply.json()["choices"]) == 2


async def test_model_version_and_health_surfaces() -> None:
    async with front_door() as (http, _, model):
        card = await http.get(f"/v1/models/{model}")
        missing = await http.get("/v1/models/gpt-4")
        listing = await http.get("/v1/models")
        info = await http.get("/v1/rackserve/info")
        version = await http.get("/version")
        head = await http.head("/health")
    assert card.status_code == 200 and card.json()["id"] == model
    assert card.json() == listing.json()["data"][0]
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"
    assert version.json() == {"version": VERSION} and VERSION
    assert head.status_code == 200
    for reply in (card, listing, info):
        assert ROOT_PATH not in reply.text and "tokenizer" not in reply.json()
