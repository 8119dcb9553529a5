"""Faults on a live cluster with real processes killed.

- A decode rank's Ray actor is killed mid-stream: the client's stream completes with no error,
  token-for-token equal to an undisturbed greedy run; Ray restarts the actor and the router routes
  to it again once its quarantine ends.
- Redis restarts empty: requests keep succeeding (as misses), the router's index takes the pool's
  `cleared` events, and cache hits come back as the cache refills.

Every test stands alone (any order, any subset): no state passes between tests, and waits are on
conditions (a rank healthy again, an index converged), never a fixed time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import httpx
import pytest
import ray

from rackserve.kv.block_hash import block_hashes
from rackserve.model import tokenizer
from services._proto import router_pb2, router_pb2_grpc
from services.redis_server import free_port
from services.router.migration import QUARANTINE_S

pytestmark = pytest.mark.integration

MODEL = "rackserve-moe-small"
PROMPT = "The rack-scale twin keeps every token it has sent. " * 3
BODY = {"model": MODEL, "prompt": PROMPT, "max_tokens": 300, "temperature": 0, "ignore_eos": True}
KILL_AFTER_CHUNKS = 25


@pytest.fixture(scope="module")
def ray_driver(fault_cluster):
    ray.init(address=fault_cluster.urls["ray"], log_to_driver=False, include_dashboard=False)
    yield
    ray.shutdown()


def rank_actor(name: str):
    named = ray.util.list_named_actors(all_namespaces=True)
    spaces = [a["namespace"] for a in named if a["name"] == name]
    assert spaces, f"no actor {name} among {named}"
    return ray.get_actor(name, namespace=spaces[0])


def all_healthy(base: str) -> None:
    """Wait until every rank is routed to again (an earlier test's quarantine has ended)."""
    for name in rank_health(base):
        wait_health(base, name, True, within_s=QUARANTINE_S + 60)


def complete(base: str, body: dict) -> dict:
    reply = httpx.post(f"{base}/v1/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    return reply.json()


def stream_and_kill(base: str, victim, hit=None) -> tuple[str, list[dict]]:
    body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
    events: list[dict] = []
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=300) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            events.append(json.loads(line[len("data: ") :]))
            if len(events) == KILL_AFTER_CHUNKS:
                hit() if hit else ray.kill(victim, no_restart=False)
    text = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
    return text, events


def test_stream_survives_decode_rank_death(fault_cluster, ray_driver) -> None:
    base = fault_cluster.base_url
    all_healthy(base)
    reference = complete(base, BODY)
    rank = reference["rackserve"]["decode"]  # an idle cluster places the same request alike
    victim = rank_actor(rank)

    text, events = stream_and_kill(base, victim)

    assert not any("error" in e for e in events), [e for e in events if "error" in e]
    last = [e for e in events if e.get("choices")][-1]
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["rackserve"]["decode"].startswith(f"{rank}->"), last["rackserve"]["decode"]
    assert events[-1]["usage"]["completion_tokens"] == BODY["max_tokens"]
    assert text == reference["choices"][0]["text"]  # greedy: token-for-token, none lost or doubled
    # Ray restarts the actor; once its quarantine (QUARANTINE_S) ends, an idle cluster places on it
    wait_health(base, rank, True, within_s=QUARANTINE_S + 60)
    again = complete(base, {**BODY, "max_tokens": 40})
    assert again["usage"]["completion_tokens"] == 40
    assert again["rackserve"]["decode"] == rank  # served there, no migration: Ray restarted it


def start_router(cluster, http_port: int, grpc_port: int) -> subprocess.Popen:
    """A second router process on the cluster's workers and Redis, as a restarted one would be."""
    config = cluster.args[cluster.args.index("--config") + 1]
    urls = cluster.urls
    command = [sys.executable, "-m", "services.router", "--config", config]
    command += ["--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    command += ["--prefill", urls["prefill (gRPC)"], "--decode", urls["decode (gRPC)"]]
    command += ["--redis-url", urls["redis"]]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_ready(base: str, router: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert router.poll() is None, "the restarted router exited"
        try:
            if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("the restarted router never became ready")


def predicted_hit(grpc_address: str, prompt: list[int]) -> int:
    """The router's predicted cached tokens for `prompt` (gRPC Route; its booking released)."""
    with grpc.insecure_channel(grpc_address) as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        hashes = block_hashes(prompt, 16, MODEL)
        decision = stub.Route(router_pb2.RouteRequest(request_id="index-probe", token_ids=prompt,
                                                      block_hashes=hashes))
        stub.Release(router_pb2.ReleaseRouteRequest(request_id="index-probe"))
    return decision.predicted_hit_tokens


def test_restarted_router_rebuilds_its_index_and_dies_cleanly(fault_cluster) -> None:
    base = fault_cluster.base_url
    seen = tokenizer.encode("seen before the restart. " * 8, bos=True)
    complete(base, {**BODY, "max_tokens": 2, "prompt": seen})
    assert metric(base, "rackserve_router_index_blocks") > 0
    old_grpc = fault_cluster.urls["router (gRPC)"]
    deadline = time.monotonic() + 60
    while (expected := predicted_hit(old_grpc, seen)) == 0:  # the prompt's events have arrived
        assert time.monotonic() < deadline, "the router never indexed the prompt it served"
        time.sleep(0.2)
    port, grpc_port = free_port(), free_port()
    router = start_router(fault_cluster, port, grpc_port)
    try:
        new = f"http://127.0.0.1:{port}"
        wait_ready(new, router)
        # Replayed from the stream (whatever earlier tests did to Redis, this prompt's events are
        # in it), the new index predicts this prompt's hit as the old router does.
        deadline = time.monotonic() + 60
        while (now := predicted_hit(f"127.0.0.1:{grpc_port}", seen)) != expected:
            assert time.monotonic() < deadline, (now, expected)
            time.sleep(0.2)
        assert metric(new, "rackserve_router_index_blocks") > 0
        assert complete(new, {**BODY, "max_tokens": 3})["usage"]["completion_tokens"] == 3
        body = {**BODY, "stream": True}
        with pytest.raises(httpx.HTTPError) as info:
            with httpx.stream("POST", f"{new}/v1/completions", json=body, timeout=30) as reply:
                for i, _ in enumerate(reply.iter_lines()):
                    if i == 10:
                        router.kill()  # SIGKILL mid-stream
        assert not isinstance(info.value, httpx.TimeoutException)  # a clean error, not a hang
    finally:
        router.kill()
        router.wait()
    assert complete(base, {**BODY, "max_tokens": 3})["usage"]["completion_tokens"] == 3


def metric(base: str, name: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_redis_restarting_empty_keeps_requests_succeeding(fault_cluster) -> None:
    base = fault_cluster.base_url
    body = {**BODY, "max_tokens": 8, "prompt": "Redis may restart empty at any time. " * 6}
    before = complete(base, body)
    cleared_before = metric(base, 'rackserve_router_kv_events_total{kind="cleared"}')
    fault_cluster.redis.restart_empty()
    after = [complete(base, body) for _ in range(3)]  # no error: misses at worst
    assert all(a["choices"][0]["text"] == before["choices"][0]["text"] for a in after)
    deadline = time.monotonic() + 30
    while metric(base, 'rackserve_router_kv_events_total{kind="cleared"}') <= cleared_before:
        assert time.monotonic() < deadline, "the router never saw the pool's `cleared` events"
        time.sleep(0.2)
    fresh = {**body, "prompt": "A prompt first seen after the restart, long enough. " * 6}
    complete(base, fresh)
    again = complete(base, fresh)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # hits recover


def test_prefill_rank_death_reroutes_its_requests(fault_cluster, ray_driver) -> None:
    base = fault_cluster.base_url
    all_healthy(base)
    probe = {**BODY, "max_tokens": 1, "prompt": "which prefill rank is first when idle? " * 3}
    rank = complete(base, probe)["rackserve"]["prefill"]
    long_prompt = "".join(f"prefill rank death {i:04d}. " for i in range(150))  # ~3.5k tokens
    body = {**BODY, "max_tokens": 1, "prompt": long_prompt}
    victim = rank_actor(rank)
    done: dict[str, dict] = {}
    worker = threading.Thread(target=lambda: done.setdefault("r", complete(base, body)))
    worker.start()
    deadline = time.monotonic() + 60
    while httpx.get(f"{base}/admin/drain").json()["in_flight"] < 1:  # it is in prefill now
        assert time.monotonic() < deadline
        time.sleep(0.01)
    ray.kill(victim, no_restart=False)
    worker.join(timeout=300)
    reply = done["r"]
    assert reply["rackserve"]["prefill"].startswith(f"{rank}->"), reply["rackserve"]
    assert reply["usage"]["completion_tokens"] == 1
    reference = complete(base, body)  # the same greedy first token, run undisturbed
    assert reply["choices"][0]["text"] == reference["choices"][0]["text"]


def test_hung_prefill_rank_times_out_and_is_rerouted(fault_cluster, ray_driver) -> None:
    base = fault_cluster.base_url
    all_healthy(base)
    probe = {**BODY, "max_tokens": 1, "prompt": "which prefill rank is idle first, again? " * 3}
    rank = complete(base, probe)["rackserve"]["prefill"]
    pid = ray.get(rank_actor(rank).__ray_call__.remote(lambda _self: os.getpid()))
    ttft_before = metric(base, "rackserve_time_to_first_token_seconds_sum")
    os.kill(pid, signal.SIGSTOP)  # the rank hangs: alive, but answers nothing
    try:
        body = {**BODY, "max_tokens": 4, "prompt": "sent while a prefill rank hangs. " * 3}
        reply = complete(base, body)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert reply["rackserve"]["prefill"].startswith(f"{rank}->"), reply["rackserve"]
    assert reply["usage"]["completion_tokens"] == 4
    # the client waited the whole prefill deadline (8 wall s = 1.6 sim s at 5 wall s per sim s)
    # before the re-route: that wait is part of its TTFT and of the TTFT histogram
    waited_s = 8 / 5
    assert reply["rackserve"]["ttft_s"] >= waited_s, reply["rackserve"]
    assert reply["rackserve"]["queue_s"] >= waited_s, reply["rackserve"]
    added = metric(base, "rackserve_time_to_first_token_seconds_sum") - ttft_before
    assert abs(added - reply["rackserve"]["ttft_s"]) < 1e-6, (added, reply["rackserve"])


def test_hung_decode_rank_times_out_and_its_stream_migrates(fault_cluster, ray_driver) -> None:
    base = fault_cluster.base_url
    all_healthy(base)
    reference = complete(base, BODY)
    rank = reference["rackserve"]["decode"]
    pid = ray.get(rank_actor(rank).__ray_call__.remote(lambda _self: os.getpid()))
    try:  # the rank hangs mid-stream: alive, but no chunk comes within the chunk deadline
        text, events = stream_and_kill(base, None, hit=lambda: os.kill(pid, signal.SIGSTOP))
    finally:
        os.kill(pid, signal.SIGCONT)
    assert not any("error" in e for e in events), [e for e in events if "error" in e]
    last = [e for e in events if e.get("choices")][-1]
    assert last["rackserve"]["decode"].startswith(f"{rank}->"), last["rackserve"]["decode"]
    sibling = rank.rsplit("/", 1)[0]  # its instance stalls with it: the stream left the instance
    assert not last["rackserve"]["decode"].split("->")[-1].startswith(f"{sibling}/")
    assert events[-1]["usage"]["completion_tokens"] == BODY["max_tokens"]
    assert text == reference["choices"][0]["text"]  # greedy: token-for-token, none lost or doubled


def rank_health(base: str) -> dict[str, dict]:
    ranks = httpx.get(f"{base}/admin/ranks", timeout=30).json()["ranks"]
    return {f"{r['instance']}/{r['rank']}": r for r in ranks}


def wait_health(base: str, rank: str, healthy: bool, within_s: float = 60) -> dict:
    deadline = time.monotonic() + within_s
    while (state := rank_health(base)[rank])["healthy"] != healthy:
        assert time.monotonic() < deadline, state
        time.sleep(0.2)
    return state


def test_health_probe_excludes_a_stopped_rank_until_it_recovers(fault_cluster, ray_driver) -> None:
    base = fault_cluster.base_url
    all_healthy(base)
    short = {**BODY, "max_tokens": 8}
    rank = complete(base, short)["rackserve"]["decode"]  # an idle cluster places it here
    pid = ray.get(rank_actor(rank).__ray_call__.remote(lambda _self: os.getpid()))
    os.kill(pid, signal.SIGSTOP)  # idle and stopped: no request notices, only the probe can
    try:
        assert wait_health(base, rank, False)["down"] == ["probe"]
        elsewhere = complete(base, short)
        assert "->" not in elsewhere["rackserve"]["decode"]  # routed away, not migrated
        assert elsewhere["rackserve"]["decode"] != rank
    finally:
        os.kill(pid, signal.SIGCONT)
    assert wait_health(base, rank, True)["down"] == []
    assert complete(base, short)["rackserve"]["decode"] == rank  # routed to again


def test_draining_an_instance_lets_its_streams_finish_and_routes_new_work_away(
    fault_cluster,
) -> None:
    base = fault_cluster.base_url
    all_healthy(base)
    short = {**BODY, "max_tokens": 8}
    rank = complete(base, short)["rackserve"]["decode"]  # an idle cluster places work here
    instance = rank.rsplit("/", 1)[0]
    drain = f"{base}/admin/drain?instance={instance}"
    long_body = {**BODY, "max_tokens": 600}
    done: dict[str, dict] = {}
    worker = threading.Thread(target=lambda: done.setdefault("r", complete(base, long_body)))
    worker.start()
    deadline = time.monotonic() + 60
    while httpx.get(drain).json()["running"] < 1:  # the long request runs on the instance
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        state = httpx.post(drain).json()
        assert state == {"instance": instance, "draining": True, "running": 1}
        elsewhere = complete(base, short)["rackserve"]["decode"]
        assert not elsewhere.startswith(f"{instance}/") and "->" not in elsewhere
        worker.join(timeout=300)
        reply = done["r"]
        assert reply["rackserve"]["decode"] == rank  # finished where it ran, not migrated
        assert reply["usage"]["completion_tokens"] == long_body["max_tokens"]
        assert httpx.get(drain).json() == {"instance": instance, "draining": True, "running": 0}
    finally:
        httpx.delete(drain)
    assert httpx.get(drain).json()["draining"] is False
    assert complete(base, short)["rackserve"]["decode"] == rank  # routed to again
    assert httpx.post(f"{base}/admin/drain?instance=no-such").status_code == 404
