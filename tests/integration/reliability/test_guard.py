"""Front-door guard on a live cluster: API key, bounded admission (429 / 503), drain, and logs
free of keys and request content."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.integration.reliability.conftest import API_KEY

pytestmark = pytest.mark.integration

MODEL = "rackserve-moe-small"
AUTH = {"authorization": f"Bearer {API_KEY}"}
SHORT = {"model": MODEL, "prompt": "short", "max_tokens": 2, "temperature": 0}


def post(
    base: str, body: dict, headers: dict | None = AUTH, timeout: float = 120
) -> httpx.Response:
    return httpx.post(f"{base}/v1/completions", json=body, headers=headers, timeout=timeout)


def wait_state(base: str, **want: int) -> dict:
    for _ in range(600):
        state = httpx.get(f"{base}/admin/drain", headers=AUTH).json()
        if all(state[k] == v for k, v in want.items()):
            return state
        time.sleep(0.05)
    raise AssertionError(f"front door never reached {want}: {state}")


def test_api_key_required_on_v1_and_admin(guarded_cluster) -> None:
    base = guarded_cluster.base_url
    for headers in (None, {"authorization": "Bearer wrong"}, {"authorization": API_KEY}):
        reply = post(base, SHORT, headers)
        assert reply.status_code == 401 and reply.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{base}/v1/models", headers=headers).status_code == 401
        assert httpx.post(f"{base}/admin/drain", headers=headers).status_code == 401
        one = f"{base}/admin/drain?instance=decode-0"
        assert httpx.post(one, headers=headers).status_code == 401
    assert httpx.get(f"{base}/health").status_code == 200  # probes stay open
    assert httpx.get(f"{base}/v1/models", headers=AUTH).status_code == 200
    missing = httpx.get(f"{base}/admin/drain?instance=no-such", headers=AUTH)
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "instance"
    reply = post(base, SHORT)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 2


def test_queue_full_is_429_and_queue_deadline_is_503(guarded_cluster) -> None:
    base = guarded_cluster.base_url
    long = {**SHORT, "max_tokens": 3000, "ignore_eos": True, "stream": True}
    queued: dict[str, httpx.Response] = {}
    with httpx.stream("POST", f"{base}/v1/completions", json=long, headers=AUTH, timeout=120) as a:
        assert a.status_code == 200
        lines = a.iter_lines()
        first = [next(lines) for _ in range(3)]  # the stream runs: it holds the only slot
        try:
            wait_state(base, in_flight=1, queued=0)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; stream: {first} ... {a.read()[-600:]!r}") from None
        waiter = threading.Thread(target=lambda: queued.setdefault("b", post(base, SHORT)))
        waiter.start()
        wait_state(base, in_flight=1, queued=1)
        rejected = post(base, SHORT)
        assert rejected.status_code == 429, rejected.text
        assert rejected.headers["retry-after"] == "1"
        assert rejected.json()["error"]["type"] == "rate_limit_error"
        waiter.join(timeout=60)
        assert queued["b"].status_code == 503, queued["b"].text
        assert "queue" in queued["b"].json()["error"]["message"]
    wait_state(base, in_flight=0, queued=0)  # closing the stream frees its slot
    reply = post(base, SHORT)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 2


def test_drain_lets_running_finish_and_refuses_new(guarded_cluster) -> None:
    base = guarded_cluster.base_url
    running: dict[str, httpx.Response] = {}
    body = {**SHORT, "max_tokens": 12, "ignore_eos": True}
    worker = threading.Thread(target=lambda: running.setdefault("r", post(base, body)))
    worker.start()
    wait_state(base, in_flight=1)
    state = httpx.post(f"{base}/admin/drain", headers=AUTH).json()
    assert state["draining"] is True and state["in_flight"] == 1
    refused = post(base, SHORT)
    assert refused.status_code == 503 and "draining" in refused.json()["error"]["message"]
    assert httpx.get(f"{base}/ready").status_code == 503
    worker.join(timeout=120)
    assert running["r"].status_code == 200  # the running request finished, nothing lost
    assert running["r"].json()["usage"]["completion_tokens"] == 12
    assert wait_state(base, in_flight=0)["draining"] is True
    httpx.delete(f"{base}/admin/drain", headers=AUTH)
    assert post(base, SHORT).status_code == 200


def test_logs_hold_no_key_and_no_request_content(guarded_cluster) -> None:
    base = guarded_cluster.base_url
    marker = "zqx-secret-prompt-31337"
    assert post(base, {**SHORT, "prompt": marker}).status_code == 200
    assert post(base, {**SHORT, "prompt": marker, "temperature": 9}).status_code == 400
    logs = list(guarded_cluster.log_dir.glob("*.log"))
    assert logs
    output = "".join(guarded_cluster.lines)
    for text in [p.read_text(errors="replace") for p in logs] + [output]:
        assert API_KEY not in text and marker not in text
