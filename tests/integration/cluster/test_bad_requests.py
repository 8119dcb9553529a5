"""Bad requests get OpenAI-style 4xx errors at the front door and leave the workers untouched."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.integration

MODEL = "rackserve-moe-small"
OK = {"model": MODEL, "prompt": "fine", "max_tokens": 3, "temperature": 0}


def post(
    base: str, body: object, path: str = "/v1/completions", raw: bytes | None = None
) -> httpx.Response:
    if raw is not None:
        return httpx.post(
            f"{base}{path}", content=raw, headers={"content-type": "application/json"}, timeout=60
        )
    return httpx.post(f"{base}{path}", json=body, timeout=60)


def assert_openai_error(reply: httpx.Response, status: int, param: str | None) -> dict:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param
    return error


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "hi", "max_tokens": 3}, "model"),
        ({**OK, "max_tokens": -1}, "max_tokens"),
        ({**OK, "temperature": 7}, "temperature"),
        ({**OK, "frobnicate": True}, "frobnicate"),
        ({**OK, "prompt": ""}, "prompt"),
        ({**OK, "n": 17}, "n"),
        ({**OK, "logprobs": 21}, "logprobs"),
    ],
)
def test_invalid_completion_fields(live_cluster, body: dict, param: str) -> None:
    error = assert_openai_error(post(live_cluster.base_url, body), 400, param)
    if param == "frobnicate":
        assert error["message"] == "Unrecognized request argument supplied: frobnicate"


def test_stream_options_without_stream_is_400_as_in_vllm(live_cluster) -> None:
    body = {**OK, "stream_options": {"include_usage": True}}
    error = assert_openai_error(post(live_cluster.base_url, body), 400, None)
    assert error["message"] == "Stream options can only be defined when `stream=True`."


def test_non_json_body(live_cluster) -> None:
    assert_openai_error(post(live_cluster.base_url, None, raw=b"{not json"), 400, None)


def test_chat_unknown_field_and_bad_role(live_cluster) -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert_openai_error(
        post(live_cluster.base_url, {**chat, "bogus": 1}, "/v1/chat/completions"), 400, "bogus"
    )
    bad_role = {**chat, "messages": [{"role": "robot", "content": "hi"}]}
    assert_openai_error(
        post(live_cluster.base_url, bad_role, "/v1/chat/completions"), 400, "messages.0.role"
    )


def test_prompt_over_context_limit(live_cluster) -> None:
    error = assert_openai_error(
        post(live_cluster.base_url, {**OK, "prompt": "x" * 5000}), 400, "prompt"
    )
    assert error["code"] == "context_length_exceeded"
    error = assert_openai_error(
        post(live_cluster.base_url, {**OK, "prompt": "x" * 4000, "max_tokens": 200}),
        400,
        "max_tokens",
    )
    assert error["code"] == "context_length_exceeded"


def test_unknown_model_is_404(live_cluster) -> None:
    reply = post(live_cluster.base_url, {**OK, "model": "gpt-4"})
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "model_not_found"


def test_workers_unaffected_after_bad_requests(live_cluster) -> None:
    for body in ({**OK, "max_tokens": -5}, {**OK, "prompt": "y" * 9000}, {"model": MODEL}):
        assert post(live_cluster.base_url, body).status_code == 400
    assert httpx.get(f"{live_cluster.base_url}/ready").status_code == 200
    reply = post(live_cluster.base_url, {**OK, "ignore_eos": True})
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 3
    metrics = httpx.get(f"{live_cluster.base_url}/metrics").text
    assert 'rackserve_requests_total{status="error"}' not in metrics
