"""Schemathesis fuzzes every operation of the router's own OpenAPI schema against the live cluster:
no 5xx, and every documented response matches its schema. Bounded examples, so it fits CI.

Generated `max_tokens` within the context are capped at a few tokens so valid requests finish
quickly; values past the context are sent as generated (they must get 400). Most generated
`model` names are replaced by the served one, so the fuzz reaches the fields behind the 404.
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error, response_schema_conformance

pytestmark = pytest.mark.integration

EXAMPLES_PER_OPERATION = 60
MODEL = "rackserve-moe-small"
FAST_TOKENS = 4
CHECKS = [not_a_server_error, response_schema_conformance]


def _max_context(base: str) -> int:
    """The served context length, as the server states it (not a copy of the scenario's)."""
    info = httpx.get(f"{base}/v1/rackserve/info", timeout=30).json()
    assert isinstance(info["max_context"], int) and info["max_context"] > FAST_TOKENS, info
    return info["max_context"]


def _fast(case: schemathesis.Case, max_context: int) -> schemathesis.Case:
    body = case.body
    if isinstance(body, dict):
        model = body.get("model")
        if isinstance(model, str) and len(model) % 4:  # most requests name the served model
            body["model"] = MODEL
        for key in ("max_tokens", "max_completion_tokens"):
            value = body.get(key)
            if isinstance(value, int) and FAST_TOKENS < value <= max_context:
                body[key] = FAST_TOKENS
        if "max_tokens" not in body and "max_completion_tokens" not in body:
            body["max_tokens"] = FAST_TOKENS
    return case


def _operations(base: str) -> list:
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def test_schema_lists_the_openai_routes(live_cluster) -> None:
    paths = {op.path for op in _operations(live_cluster.base_url)}
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models"} <= paths


def _fuzz(operation, base: str, seen: dict[int, int], max_context: int) -> None:
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy())
    def run(case: schemathesis.Case) -> None:
        response = _fast(case, max_context).call_and_validate(base_url=base, checks=CHECKS, timeout=120)
        seen[response.status_code] = seen.get(response.status_code, 0) + 1

    run()


def test_fuzz_every_operation(live_cluster) -> None:
    statuses: dict[str, dict[int, int]] = {}
    max_context = _max_context(live_cluster.base_url)
    for operation in _operations(live_cluster.base_url):
        seen = statuses.setdefault(f"{operation.method.upper()} {operation.path}", {})
        _fuzz(operation, live_cluster.base_url, seen, max_context)
    print(statuses)
    assert all(status < 500 for s in statuses.values() for status in s), statuses
    posts = statuses["POST /v1/completions"]
    assert 400 in posts and 200 in posts, statuses  # both rejected and served requests were fuzzed
