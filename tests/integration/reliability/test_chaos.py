"""Chaos on a live cluster: concurrent greedy streams while a busy decode rank's actor, the decode
service, the prefill service, the router, Redis and the Ray head (its GCS) are killed in turn,
restarting nothing by hand (tests/integration/reliability/chaos.py says how each request is judged).
No request is lost, the killed rank's streams migrate, the cluster serves again by itself after
each fault (the Ray head's too: the supervisor restarts Ray and the services holding rank actors),
/ready is false while a request would fail and a request sent when it turns true succeeds, and
Ctrl-C then stops everything within seconds with exit 0."""

from __future__ import annotations

import asyncio

import pytest

from services.router.stream_errors import timed_out, unavailable
from tests.integration.reliability.chaos import (
    FAULTS,
    Outcome,
    chaos,
    classify,
    idle_metrics,
    start_cluster,
    stop_with_ctrl_c,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def chaos_cluster(tmp_path_factory):
    launcher = start_cluster(tmp_path_factory.mktemp("chaos"))
    yield launcher
    if launcher.proc.poll() is None:
        launcher.stop()


def test_no_request_is_lost_while_every_part_is_killed_in_turn(chaos_cluster):
    reports = {r.fault: r for r in asyncio.run(chaos(chaos_cluster))}
    summary = {f: r.as_dict() for f, r in reports.items()}
    assert list(reports) == list(FAULTS)
    for fault, report in reports.items():
        assert report.counts["lost"] == 0, summary[fault]
        assert report.counts["completed"] > 0, summary[fault]
    # A rank actor's death is invisible: its streams migrate and complete.
    assert reports["rank_actor"].counts["clean_error"] == 0, summary["rank_actor"]
    assert reports["rank_actor"].counts["migrated"] > 0, summary["rank_actor"]
    assert reports["rank_actor"].in_flight > 0, summary["rank_actor"]
    assert summary["redis"]["ready_false_after_s"] <= 2.5, summary["redis"]  # "a second or two"
    # /ready tells the truth: false after each fault that stops requests, true again only when a
    # request succeeds (the rank actor's fault stops none: the instance's other ranks serve).
    for fault in ("decode", "prefill", "router", "redis", "ray_head"):
        assert summary[fault]["ready_false_after_s"] is not None, summary[fault]
        assert summary[fault]["ready_true_again_after_s"] is not None, summary[fault]
    for row in summary.values():
        if row["ready_true_again_after_s"] is not None:
            assert row["first_request_when_ready_again"] == "completed", row
    # The Ray head: streams in flight end cleanly, in the documented words, and serving resumes.
    assert reports["ray_head"].in_flight > 0, summary["ray_head"]
    assert reports["ray_head"].counts["clean_error"] > 0, summary["ray_head"]
    assert reports["redis"].counts["clean_error"] == 0, summary["redis"]  # misses only
    assert summary["router"]["index_blocks_after_restart"] > 0, summary["router"]  # replayed
    # A dead decode service's clients are told so, in the documented words.
    assert set(summary["decode"]["error_messages"]) <= {unavailable("decode"), timed_out("decode")}


def _in_band(message: str) -> Outcome:
    return classify(200, ['{"choices": [{"text": "a"}]}', f'{{"error": {{"message": "{message}"}}}}'], "a")


def test_only_documented_messages_are_clean_errors():
    assert _in_band("worker unavailable (decode); retry the request").kind == "clean_error"
    assert _in_band("internal error; retry the request (details in the router log)").kind == "lost"
    assert _in_band("no healthy decode rank of layout None").kind == "lost"
    refused = classify(503, ['{"error": {"message": "no worker available: layout None"}}'], "")
    assert refused.kind == "lost"


def test_after_the_faults_metrics_are_true_once_idle(chaos_cluster):
    idle = asyncio.run(idle_metrics(chaos_cluster.base_url))
    assert idle["duplicated_series"] == 0, idle
    assert idle["requests_running"] == 0 and idle["requests_waiting"] == 0, idle
    assert idle["kv_cache_usage_perc"] == 0 and idle["requests_in_flight"] == 0, idle
    assert idle["prefix_hit_rate_series"] > 0, idle


def test_ctrl_c_stops_everything_within_seconds_with_exit_0(chaos_cluster):
    pids = chaos_cluster.descendants()
    assert pids
    code, seconds = stop_with_ctrl_c(chaos_cluster)
    assert code == 0 and seconds < 10.0, (code, seconds)
    from tests.e2e.test_launcher import alive

    assert not [p for p in pids if alive(p)]
