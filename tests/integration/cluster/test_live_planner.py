"""The planner in the live cluster (issue 52 item 3): real Ray rank actors (mock engine), real gRPC and
HTTP, the router's planner starting and stopping instances under a load step.

The deployment builds 2 DEP2 prefill + 2 Wide-EP 4 decode instances; the planner starts with one of
each. Policy `sla` with targets no deployment meets: under load it asks for every instance (the
closest to the targets), with no load for the fewest (rackserve/planner/policies.py). So:
- under the step the second instance of each role starts on its worker at once (actors up) but is
  routed to only after the modelled start-up delay (planner.startup_s);
- once the load is gone one instance of each role drains (the least loaded, either one): it leaves
  routing, its running requests finish (no request fails), then its worker stops its actors;
- /admin/planner and the planner metrics show the decisions and planned vs running instances.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import yaml

from services.redis_server import free_port
from tests.e2e.launcher_proc import LauncherProcess, launcher_command

pytestmark = pytest.mark.integration

STARTUP_S = 3.0  # planner seconds (= wall seconds at time_scale 1) from start to routable
CONFIG = {
    "engine": {"kind": "mock", "block_size": 16, "max_context": 4096, "cache_blocks_per_rank": 1024,
               "max_num_batched_tokens": 512, "max_num_seqs": 64},
    "timing": {"hardware": "vr200", "model": "deepseek-v4.1-flash", "optimizations": "rubin-optimized"},
    "deployment": {"prefill": [{"layout": "dep2", "count": 2}],
                   "decode": [{"layout": "wide-ep", "count": 2, "ranks": 4}]},
    "routing": {"policy": "least-uncached-work"},
    "cluster": {"time_scale": 1.0, "prometheus": False},
    "planner": {"policy": "sla", "tick_s": 1.0, "metric_pull_s": 0.25, "ttft_target_s": 1e-6,
                "itl_target_s": 1e-6, "initial_prefill": 1, "initial_decode": 1, "startup_s": STARTUP_S},
}
EXTRA = ("prefill-dep2-1", "decode-wide-ep-1")


def _cluster(tmp_path_factory, planner: dict):
    path = tmp_path_factory.mktemp("planner") / "planner.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "planner": {**CONFIG["planner"], **planner}}))
    proc = LauncherProcess(launcher_command("--config", str(path), "--port", str(free_port()), "--engine", "mock"))
    return proc.start(timeout_s=240)


@pytest.fixture
def planned_cluster(tmp_path_factory):
    proc = _cluster(tmp_path_factory, {})
    yield proc
    proc.stop()


@pytest.fixture
def load_planned_cluster(tmp_path_factory):
    """Dynamo's load-based policy from both instances of each role: light load keeps the decode KV
    use below kv_down and the prefill queue below queue_down, so one of each drains under load."""
    proc = _cluster(tmp_path_factory, {"policy": "load", "initial_prefill": 2, "initial_decode": 2, "tick_s": 4.0})
    yield proc
    proc.stop()


def _planner(base: str) -> dict:
    return httpx.get(f"{base}/admin/planner", timeout=10).json()


def _instances(base: str) -> dict[str, dict]:
    return {i["name"]: i for i in _planner(base)["instances"]}


async def _one(client: httpx.AsyncClient, base: str, k: int, served: list, max_tokens: int) -> int:
    r = await client.post(f"{base}/v1/completions", json={
        "model": "rackserve-moe-small", "prompt": f"request {k} " + "word " * 300, "max_tokens": max_tokens,
        "ignore_eos": True})
    if r.status_code == 200:
        served.append(r.json()["rackserve"]["prefill"])  # "instance/rank"
    return r.status_code


async def _load(base: str, seconds: float, lanes: int, served: list, seen: list, max_tokens: int = 40) -> list[int]:
    """`lanes` closed-loop clients for `seconds`; every reply's status. `seen`: the planner's view
    of the extra instances, sampled as the load runs (state, running on the worker)."""
    codes: list[int] = []
    end = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=60) as client:
        async def lane(i: int) -> None:
            k = 0
            while time.monotonic() < end:
                codes.append(await _one(client, base, i * 100000 + k, served, max_tokens))
                k += 1

        async def watch() -> None:
            while time.monotonic() < end:
                r = await client.get(f"{base}/admin/planner")
                now = r.json()["now_s"]
                seen.append((now, {i["name"]: (i["state"], i["running"]) for i in r.json()["instances"]}))
                await asyncio.sleep(0.2)

        await asyncio.gather(*(lane(i) for i in range(lanes)), watch())
    return codes


def test_a_load_step_starts_instances_after_their_delay_and_drains_them_without_losing_requests(planned_cluster):
    base = planned_cluster.base_url
    first = _instances(base)
    assert [n for n, i in first.items() if i["state"] == "active"] == ["prefill-dep2-0", "decode-wide-ep-0"]
    assert all(not first[n]["running"] and first[n]["state"] == "off" for n in EXTRA)
    ranks = httpx.get(f"{base}/admin/ranks", timeout=10).json()
    assert not any(r["healthy"] for r in ranks["ranks"] if r["instance"] in EXTRA)

    served: list[str] = []
    seen: list = []
    codes = asyncio.run(_load(base, 14.0, 6, served, seen))
    assert codes and all(c == 200 for c in codes), sorted(set(codes))
    state = _planner(base)
    started = {c[0]: d["t_s"] for d in state["decisions"] for c in d["changes"] if c[1] == "starting"}
    assert set(EXTRA) <= set(started), state["decisions"]
    for name in EXTRA:
        # started on its worker while starting, active only STARTUP_S later
        assert any(s[name] == ("starting", True) for _, s in seen), name
        active_at = min(t for t, s in seen if s[name][0] == "active")
        assert active_at >= started[name] + STARTUP_S - 1e-6
    # the new prefill instance took requests once routable
    assert any(p.startswith("prefill-dep2-1/") for p in served), set(served)

    # load gone: one instance of each role drains (the least loaded: either one) and stops
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = _instances(base)
        off = [n for n, i in now.items() if i["state"] == "off" and not i["running"]]
        if sorted(n.split("-")[0] for n in off) == ["decode", "prefill"]:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"not drained and stopped: {now}")
    state = _planner(base)
    drained = {c[0] for d in state["decisions"] for c in d["changes"] if c[1] == "draining"}
    assert set(off) <= drained, (off, state["decisions"])
    report = state["report"]
    assert report["requests"] == len(codes) and report["gpu_hours"] > 0
    assert report["sla_attainment"] == 0.0  # targets no request meets: every one counted as a miss
    deadline = time.monotonic() + 10  # the router's next health poll of the workers
    while time.monotonic() < deadline:
        ranks = httpx.get(f"{base}/admin/ranks", timeout=10).json()["ranks"]
        if not any("pid" in r for r in ranks if r["instance"] in off):
            break  # no worker reports them
        time.sleep(0.5)
    else:
        raise AssertionError(f"a worker still reports {off}: {ranks}")
    assert not any(r["healthy"] for r in ranks if r["instance"] in off)
    metrics = httpx.get(f"{base}/metrics", timeout=10).text
    assert 'rackserve_planner_instances{role="prefill",state="planned"} 1.0' in metrics
    assert 'rackserve_planner_instances{role="decode",state="running"} 1.0' in metrics
    assert f'rackserve_planner_sla_requests_total{{met="false"}} {float(len(codes))}' in metrics


def test_an_instance_drained_under_load_finishes_its_requests_then_stops(load_planned_cluster):
    base = load_planned_cluster.base_url
    served: list[str] = []
    seen: list = []
    # 16 lanes, each request ~3 s of decode: both decode instances run several when the first tick comes
    codes = asyncio.run(_load(base, 12.0, 16, served, seen, max_tokens=200))
    assert codes and all(c == 200 for c in codes), sorted(set(codes))  # none lost to the drains
    state = _planner(base)
    drains = [c for d in state["decisions"] for c in d["changes"] if c[1] == "draining"]
    decode = next((c for c in drains if c[0].startswith("decode")), None)
    assert decode is not None, state["decisions"]  # KV use stays far below kv_down
    assert decode[2] > 0  # it was running requests when told to drain: they finished (all 200)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        now = _instances(base)[decode[0]]
        if now["state"] == "off" and not now["running"]:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"not stopped: {now}")
    # while it drained it was out of routing but still running on its worker
    assert any(s[decode[0]] == ("draining", True) for _, s in seen)


def test_without_a_planner_admin_planner_is_404_and_scale_names_a_bad_instance(live_cluster):
    r = httpx.get(f"{live_cluster.base_url}/admin/planner", timeout=10)
    assert r.status_code == 404 and "planner" in r.json()["error"]["message"]
    import grpc

    from services._proto import prefill_pb2, prefill_pb2_grpc

    with grpc.insecure_channel(live_cluster.urls["prefill (gRPC)"]) as channel:
        stub = prefill_pb2_grpc.PrefillStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Scale(prefill_pb2.ScaleRequest(instance="prefill-nope-9", run=True), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "prefill-nope-9" in err.value.details()
