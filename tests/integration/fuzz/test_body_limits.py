"""Hostile request bodies are refused at the front door with OpenAI-style errors, never a 5xx."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.integration

MODEL = "rackserve-moe-small"
MAX_BODY = 1 << 20  # cluster.max_body_bytes default
MAX_DEPTH = 32  # cluster.max_json_depth default
HEADERS = {"content-type": "application/json"}


def post_raw(base: str, raw: bytes | object, path: str = "/v1/completions") -> httpx.Response:
    return httpx.post(f"{base}{path}", content=raw, headers=HEADERS, timeout=60)


def error_of(reply: httpx.Response, status: int) -> dict:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def test_oversized_body_is_413(live_cluster) -> None:
    body = b'{"model":"%s","prompt":"%s"}' % (MODEL.encode(), b"a" * (MAX_BODY + 10))
    error = error_of(post_raw(live_cluster.base_url, body), 413)
    assert error["code"] == "request_too_large" and str(MAX_BODY) in error["message"]


def test_oversized_chunked_body_without_length_is_413(live_cluster) -> None:
    def chunks():
        yield b'{"model":"%s","prompt":"' % MODEL.encode()
        for _ in range(MAX_BODY // 65536 + 2):
            yield b"b" * 65536
        yield b'"}'

    error_of(post_raw(live_cluster.base_url, chunks()), 413)


def test_body_just_under_the_limit_reaches_validation(live_cluster) -> None:
    body = b'{"model":"%s","prompt":"%s"}' % (MODEL.encode(), b"c" * (MAX_BODY - 100))
    error = error_of(post_raw(live_cluster.base_url, body), 400)  # the prompt is past the context
    assert error["code"] == "context_length_exceeded"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_deeply_nested_json_is_400(live_cluster, path: str) -> None:
    deep = b'{"model":"%s","prompt":%s1%s}' % (MODEL.encode(), b"[" * 5000, b"]" * 5000)
    error = error_of(post_raw(live_cluster.base_url, deep, path), 400)
    assert f"deeper than {MAX_DEPTH}" in error["message"]


def test_nesting_at_the_limit_gets_field_validation(live_cluster) -> None:
    ok_depth = b'{"model":"%s","prompt":%s1%s}' % (
        MODEL.encode(),
        b"[" * (MAX_DEPTH - 1),
        b"]" * (MAX_DEPTH - 1),
    )
    error = error_of(post_raw(live_cluster.base_url, ok_depth), 400)
    assert "deeper" not in error["message"] and error["param"] is not None


def test_brackets_inside_strings_do_not_count(live_cluster) -> None:
    body = b'{"model":"%s","prompt":"%s","max_tokens":2,"temperature":0}' % (
        MODEL.encode(),
        b"[{" * 100,
    )
    reply = post_raw(live_cluster.base_url, body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 2


def test_invalid_utf8_is_400(live_cluster) -> None:
    body = b'{"model":"%s","prompt":"caf\xc3\x28 \xff"}' % MODEL.encode()
    error = error_of(post_raw(live_cluster.base_url, body), 400)
    assert "UTF-8" in error["message"]


@pytest.mark.parametrize("max_tokens", [10**6, 2**63, 10**40])
def test_huge_max_tokens_is_400(live_cluster, max_tokens: int) -> None:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": max_tokens}
    error = error_of(httpx.post(f"{live_cluster.base_url}/v1/completions", json=body), 400)
    assert error["param"] == "max_tokens" and error["code"] == "context_length_exceeded"


def test_n_above_sixteen_and_best_of_are_400(live_cluster) -> None:
    for field, value, path in (("n", 17, "/v1/chat/completions"), ("best_of", 2, "/v1/completions")):
        body = {"model": MODEL, field: value}
        if path.endswith("chat/completions"):
            body["messages"] = [{"role": "user", "content": "hi"}]
        else:
            body["prompt"] = "hi"
        reply = httpx.post(f"{live_cluster.base_url}{path}", json=body)
        assert error_of(reply, 400)["param"] == field


def test_unknown_model_on_chat_is_404(live_cluster) -> None:
    body = {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}
    reply = httpx.post(f"{live_cluster.base_url}/v1/chat/completions", json=body)
    error = error_of(reply, 404)
    assert error["code"] == "model_not_found" and error["param"] == "model"


def test_unknown_path_is_404_and_wrong_method_405(live_cluster) -> None:
    error_of(httpx.get(f"{live_cluster.base_url}/v1/nothing"), 404)
    error_of(httpx.get(f"{live_cluster.base_url}/v1/completions"), 405)


@pytest.mark.parametrize(("seed", "status"), [(-440, 200), (2**64 - 1, 200), (2**64, 400)])
def test_seed_range(live_cluster, seed: int, status: int) -> None:
    """Found by the schemathesis fuzz: a negative seed was a 500 (the gRPC field is uint64)."""
    body = {"model": MODEL, "prompt": "seeded", "max_tokens": 2, "seed": seed}
    reply = httpx.post(f"{live_cluster.base_url}/v1/completions", json=body, timeout=60)
    assert reply.status_code == status, reply.text
    if status == 400:
        assert reply.json()["error"]["param"] == "seed"
