"""The front door's surface for outside load clients, against the live cluster: vLLM's per-chunk
usage, /tokenize and /detokenize, vLLM's extra fields, the simulated-clock headers, and 400s for
text the tokenizer cannot encode."""

from __future__ import annotations

import json

import httpx
import pytest

from rackserve.model import hf_tokenizer, tokenizer

pytestmark = pytest.mark.integration

MODEL = "rackserve-moe-small"
CHAT = [{"role": "user", "content": "Describe the KV pool."}]


def sse(reply: httpx.Response) -> list[dict]:
    lines = [line.removeprefix("data: ") for line in reply.text.splitlines() if line]
    assert lines[-1] == "[DONE]", reply.text[-300:]
    return [json.loads(line) for line in lines[:-1]]


def post(base: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{base}{path}", json=body, timeout=60)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_continuous_usage_stats_in_every_chunk(live_cluster, path: str) -> None:
    body = {"model": MODEL, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    body |= {"prompt": "The rack"} if "chat" not in path else {"messages": CHAT}
    chunks = sse(post(live_cluster.base_url, path, body))
    content, final = chunks[:-1], chunks[-1]
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 8
    prompt = final["usage"]["prompt_tokens"]
    counts = [c["usage"]["completion_tokens"] for c in content]
    assert all(c["usage"]["prompt_tokens"] == prompt for c in content)
    assert all(c["usage"]["total_tokens"] == prompt + n for c, n in zip(content, counts, strict=True))
    assert counts == sorted(counts) and counts[-1] == 8 and counts[0] >= 1


def test_usage_only_at_the_end_without_continuous(live_cluster) -> None:
    body = {"model": MODEL, "prompt": "The rack", "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}}
    chunks = sse(post(live_cluster.base_url, "/v1/completions", body))
    assert [c for c in chunks if "usage" in c] == [chunks[-1]]


def test_tokenize_counts_equal_usage(live_cluster) -> None:
    base = live_cluster.base_url
    text = "héllo rack \U0001f600"
    tok = post(base, "/tokenize", {"model": MODEL, "prompt": text, "return_token_strs": True}).json()
    assert tok["tokens"] == tokenizer.encode(text) and tok["count"] == len(tok["tokens"])
    alphabet = hf_tokenizer.byte_alphabet()
    assert tok["token_strs"] == [alphabet[i] for i in tok["tokens"]]
    done = post(base, "/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": 1}).json()
    assert done["usage"]["prompt_tokens"] == tok["count"]
    chat_tok = post(base, "/tokenize", {"model": MODEL, "messages": CHAT}).json()
    chat = post(base, "/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 1})
    assert chat.json()["usage"]["prompt_tokens"] == chat_tok["count"]
    assert chat_tok["max_model_len"] == httpx.get(f"{base}/v1/models").json()["data"][0]["max_model_len"]
    back = post(base, "/detokenize", {"model": MODEL, "tokens": chat_tok["tokens"]}).json()
    assert back["prompt"] == "<|bos|><|user|>Describe the KV pool.<|end|><|assistant|>"


def test_detokenize_rejects_ids_outside_vocab(live_cluster) -> None:
    reply = post(live_cluster.base_url, "/detokenize", {"tokens": [1, 99999]})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "tokens"


def test_models_card_names_context_and_no_server_path(live_cluster) -> None:
    reply = httpx.get(f"{live_cluster.base_url}/v1/models")
    card = reply.json()["data"][0]
    assert card["max_model_len"] > 0 and "tokenizer" not in card
    assert str(hf_tokenizer.path()) not in reply.text


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "a\ud800b"}, "prompt"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a\ud800b"}]},
         "messages.0.content"),
        ("/tokenize", {"prompt": "a\ud800b"}, "prompt"),
    ],
)
def test_lone_surrogate_is_a_400(live_cluster, path: str, body: dict, param: str) -> None:
    # json.dumps escapes the lone surrogate as "\ud800", as a client's JSON would carry it
    raw = json.dumps({"model": MODEL, "max_tokens": 2, **body}).encode()
    if path == "/tokenize":
        raw = json.dumps({"model": MODEL, **body}).encode()
    assert b"\\ud800" in raw
    reply = httpx.post(f"{live_cluster.base_url}{path}", content=raw,
                       headers={"content-type": "application/json"}, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert "lone surrogate U+D800" in error["message"] and "codec" not in error["message"]


def test_vllm_fields_accepted_at_neutral_values(live_cluster) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 3, "top_k": -1, "min_p": 0.0,
            "repetition_penalty": 1.0, "skip_special_tokens": True, "request_id": "r1",
            "priority": 0, "min_tokens": 3, "max_completion_tokens": 3, "use_beam_search": False,
            "spaces_between_special_tokens": True, "stop_token_ids": [], "add_special_tokens": True}
    reply = post(live_cluster.base_url, "/v1/completions", body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 3  # min_tokens = max_tokens: no EOS before


@pytest.mark.parametrize(("field", "value"), [("top_k", 5), ("use_beam_search", True),
                                              ("suffix", "x"), ("best_of", 2),
                                              ("response_format", {"type": "json_object"})])
def test_vllm_fields_not_served_are_named(live_cluster, field: str, value: object) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 3, field: value}
    reply = post(live_cluster.base_url, "/v1/completions", body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == field
    assert reply.json()["error"]["message"].startswith(f"{field}: ")


def test_sim_headers(live_cluster) -> None:
    base = live_cluster.base_url
    reply = post(base, "/v1/completions",
                 {"model": MODEL, "prompt": "The rack", "max_tokens": 6, "ignore_eos": True})
    timings = reply.json()["rackserve"]
    assert float(reply.headers["x-rackserve-sim-ttft-s"]) == pytest.approx(timings["ttft_s"], abs=1e-6)
    assert float(reply.headers["x-rackserve-sim-tpot-s"]) == pytest.approx(timings["tpot_s"], abs=1e-6)
    assert float(reply.headers["x-rackserve-time-scale"]) > 0
    with httpx.stream("POST", f"{base}/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": "The rack", "max_tokens": 6, "stream": True}) as stream:
        ttft = float(stream.headers["x-rackserve-sim-ttft-s"])
        last = [json.loads(line[6:]) for line in stream.iter_lines()
                if line.startswith("data: {")][-1]
    assert ttft == pytest.approx(last["rackserve"]["ttft_s"], abs=1e-6)


def test_chat_with_vllm_message_and_request_fields(live_cluster) -> None:
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "ok", "reasoning_content": "r", "tool_calls": []},
                {"role": "user", "content": "again"}]
    body = {"model": MODEL, "messages": messages, "max_completion_tokens": 2, "tool_choice": "none",
            "add_generation_prompt": True, "chat_template_kwargs": {"enable_thinking": False}}
    reply = post(live_cluster.base_url, "/v1/chat/completions", body)
    assert reply.status_code == 200, reply.text
    tools = {**body, "tools": [{"type": "function", "function": {"name": "f"}}]}
    reply = post(live_cluster.base_url, "/v1/chat/completions", tools)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "tools"
