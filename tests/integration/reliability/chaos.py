"""The chaos run shared by tests/integration/reliability/test_chaos.py and bench/faults/chaos.py.

A small cluster (`rackserve up`, embedded Redis) serves a steady load of concurrent greedy
streams while a fault script kills, in turn, a busy decode rank's Ray actor, the decode service,
the prefill service, the router, Redis and the Ray head's GCS; nothing is restarted by hand (the
launcher's supervisor and Ray do it). The load runs until the cluster serves again and a while
after; /ready is watched throughout, and the first request sent when it turns true again is
judged too. Every request is classified against a fault-free run of the same prompts:
- completed: the whole stream, token-for-token the fault-free text (migrated: it changed ranks);
- clean error: a retryable answer - HTTP 429/503 with an OpenAI error body, or an in-band stream
  error, whose message is one of the documented retryable ones (services/router/stream_errors.py,
  docs/operating.md), or (the router itself died) a dropped or refused connection;
- lost: anything else (a different text, a 500, a stream cut without an error, an undocumented
  message such as "internal error" or one with internals, a hang).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from services.launcher import RAY_ENV, descendants
from services.redis_server import free_port
from services.router.stream_errors import is_retryable
from tests.e2e.launcher_proc import LauncherProcess, launcher_command

MODEL = "rackserve-moe-small"
CONFIG = """\
engine: {block_size: 16, max_context: 4096, cache_blocks_per_rank: 256}
deployment:
  prefill: [{layout: dep2, count: 1}]
  decode: [{layout: wide-ep, count: 2, ranks: 2}]
engram: {shards: 1}
cluster: {prometheus: false, time_scale: 10, decode_chunk_timeout_s: 5, worker_timeout_s: 10}
"""
PROMPTS = [f"Chaos client {i} asks the rack about block {i * 7} and its neighbours. " * 2 for i in range(6)]
MAX_TOKENS = 48
CLIENTS = 4
FAULTS = ("rank_actor", "decode", "prefill", "router", "redis", "ray_head")
LOAD_BEFORE_S = 2.0  # load runs this long before the fault ...
LOAD_AFTER_S = 4.0  # ... and this long after the cluster serves again
BUSY_RANK_WAIT_S = 10.0  # the rank-actor fault waits this long at most for a busy decode rank
RECOVER_S = 90.0  # the cluster must serve again within this after a fault
REQUEST_TIMEOUT_S = 60.0  # a request taking longer is a hang: lost


@dataclass
class Outcome:
    kind: str  # completed | clean_error | lost
    detail: str = ""
    migrated: bool = False
    message: str = ""  # the error message a client got (clean or not), if any


@dataclass
class FaultReport:
    fault: str
    counts: Counter = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    recovered_s: float = 0.0  # from the kill to the first request (started after it) completing
    notes: dict = field(default_factory=dict)
    killed_at: float | None = None  # time.monotonic() of the kill
    in_flight: int = 0  # requests already running at the kill
    in_flight_errors: int = 0  # clean errors of requests already running at the kill
    messages: Counter = field(default_factory=Counter)  # error message -> how many clients got it

    def record(self, outcome: Outcome, started: float) -> None:
        self.counts[outcome.kind] += 1
        if outcome.message:
            self.messages[outcome.message] += 1
        self.counts["migrated"] += outcome.migrated
        if outcome.kind == "lost":
            self.lost.append(outcome.detail)
        after_kill = self.killed_at is not None and started >= self.killed_at
        self.in_flight += self.killed_at is not None and not after_kill
        if outcome.kind == "clean_error" and self.killed_at is not None and not after_kill:
            self.in_flight_errors += 1
        if outcome.kind == "completed" and after_kill and not self.recovered_s:
            self.recovered_s = time.monotonic() - self.killed_at

    def as_dict(self) -> dict:
        c = self.counts
        return {
            "fault": self.fault,
            "requests": c["completed"] + c["clean_error"] + c["lost"],
            "completed": c["completed"],
            "migrated": c["migrated"],
            "requests_in_flight_at_the_kill": self.in_flight,
            "clean_errors": c["clean_error"],
            "clean_errors_of_requests_in_flight_at_the_kill": self.in_flight_errors,
            "lost": c["lost"],
            "lost_details": self.lost[:5],
            "error_messages": dict(self.messages.most_common()),
            "serving_again_after_s": round(self.recovered_s, 2),
            **self.notes,
        }


def classify(status: int, events: list[str], reference: str) -> Outcome:
    """One streamed request's outcome from its HTTP status and SSE data lines."""
    if status != 200:
        body = events[0] if events else ""
        try:
            message = json.loads(body)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            return Outcome("lost", f"HTTP {status} without an OpenAI error body: {body[:120]}")
        if status in (429, 503) and is_retryable(message):
            return Outcome("clean_error", f"HTTP {status}", message=message)
        return Outcome("lost", f"HTTP {status}: {message[:120]}", message=message)
    text, migrated = "", False
    for data in events:
        if data == "[DONE]":
            if text == reference:
                return Outcome("completed", migrated=migrated)
            return Outcome("lost", f"text differs from the fault-free run: {text!r}")
        chunk = json.loads(data)
        if "error" in chunk:
            message = chunk["error"].get("message", "")
            if is_retryable(message):
                return Outcome("clean_error", "in-band error", message=message)
            return Outcome("lost", f"in-band error, not a documented one: {message[:160]}", message=message)
        for choice in chunk.get("choices", []):
            text += choice.get("text") or ""
        decode = (chunk.get("rackserve") or {}).get("decode") or ""
        migrated = migrated or "->" in decode
    return Outcome("lost", "stream ended without [DONE] or an error")


async def stream_once(client: httpx.AsyncClient, base: str, prompt: str, reference: str) -> Outcome:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": True}
    events: list[str] = []
    try:
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            async with client.stream("POST", f"{base}/v1/completions", json=body) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                    elif line.strip() and resp.status_code != 200:
                        events.append(line)
                return classify(resp.status_code, events, reference)
    except TimeoutError:
        return Outcome("lost", f"no end within {REQUEST_TIMEOUT_S} s (a hang)")
    except (httpx.RemoteProtocolError, httpx.ConnectError, httpx.ReadError) as exc:
        return Outcome("clean_error", f"connection: {type(exc).__name__}")  # retryable


async def reference_texts(base: str) -> dict[str, str]:
    """The fault-free greedy text of every prompt (the cluster is healthy now)."""
    out = {}
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        for prompt in PROMPTS:
            body = {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                    "ignore_eos": True}
            resp = await client.post(f"{base}/v1/completions", json=body)
            resp.raise_for_status()
            out[prompt] = resp.json()["choices"][0]["text"]
    return out


async def load(base: str, refs: dict[str, str], stop: asyncio.Event, report: FaultReport, idx: int) -> None:
    """One client: streams back to back until `stop` is set."""
    n = idx
    async with httpx.AsyncClient(timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=2.0)) as client:
        while not stop.is_set():
            prompt = PROMPTS[n % len(PROMPTS)]
            n += CLIENTS
            started = time.monotonic()
            outcome = await stream_once(client, base, prompt, refs[prompt])
            report.record(outcome, started)
            if outcome.kind == "clean_error":
                await asyncio.sleep(0.2)  # a client backs off before retrying


def process_pid(launcher: LauncherProcess, needle: str) -> int:
    for pid in descendants(launcher.proc.pid):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if needle in cmd:
            return pid
    raise LookupError(f"no process {needle!r} under the launcher")


def busy_decode_rank(base: str, wait_s: float = BUSY_RANK_WAIT_S) -> tuple[str, int]:
    """(instance, rank) of a decode rank with streams running now (its worker's last report,
    /admin/ranks), so that killing it has streams to migrate; the first decode rank if none is
    busy within `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        ranks = [r for r in httpx.get(f"{base}/admin/ranks", timeout=10).json()["ranks"]
                 if r["role"] == "decode"]
        busy = sorted((r for r in ranks if r.get("running")), key=lambda r: -r["running"])
        if busy or time.monotonic() > deadline:
            pick = (busy or sorted(ranks, key=lambda r: (r["instance"], r["rank"])))[0]
            return pick["instance"], pick["rank"]
        time.sleep(0.2)


def kill_rank_actor(ray_address: str, instance: str, rank: int) -> tuple[str, float]:
    """Kill the Ray actor of decode rank `instance`/`rank` as a crash would (Ray restarts it);
    its name and the time.monotonic() of the kill."""
    for key, value in RAY_ENV.items():  # loopback-only Ray, read when ray is imported
        os.environ.setdefault(key, value)
    import ray

    ray.init(address=ray_address, log_to_driver=False, include_dashboard=False)
    try:
        named = {a["name"]: a["namespace"] for a in ray.util.list_named_actors(all_namespaces=True)}
        # one actor per rank (engine real), or one per instance holding its ranks (engine mock)
        name = next((n for n in (f"{instance}/{rank}", f"{instance}/ranks") if n in named), None)
        assert name is not None, f"no actor of {instance}/{rank} among {sorted(named)}"
        ray.kill(ray.get_actor(name, namespace=named[name]), no_restart=False)
        killed_at = time.monotonic()
        time.sleep(0.5)  # let the kill reach the actor before this driver disconnects
        return name, killed_at
    finally:
        ray.shutdown()  # leave no driver behind for the next test in this process


NEEDLES = {"decode": "-m services.decode", "prefill": "-m services.prefill",
           "router": "-m services.router", "redis": "redis-server", "ray_head": "gcs_server"}


def inject(fault: str, launcher: LauncherProcess) -> tuple[str, float]:
    """Kill `fault`'s part: what was killed and the time.monotonic() of the kill."""
    if fault == "rank_actor":
        instance, rank = busy_decode_rank(launcher.base_url)
        return kill_rank_actor(launcher.urls["ray"], instance, rank)
    pid = process_pid(launcher, NEEDLES[fault])
    os.kill(pid, signal.SIGKILL)
    return f"pid {pid}", time.monotonic()


async def wait_serving(base: str, refs: dict[str, str], deadline_s: float) -> float:
    """Seconds until a request completes with its fault-free text again."""
    started = time.monotonic()
    prompt = PROMPTS[0]
    async with httpx.AsyncClient(timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=2.0)) as client:
        while time.monotonic() - started < deadline_s:
            if (await stream_once(client, base, prompt, refs[prompt])).kind == "completed":
                return time.monotonic() - started
            await asyncio.sleep(0.5)
    raise TimeoutError(f"the cluster did not serve again within {deadline_s} s")


async def watch_ready(base: str, refs: dict[str, str], stop: asyncio.Event) -> dict:
    """From the kill until `stop`: how soon /ready turned false and true again, and how the first
    request sent the moment it was true again ended (it must complete: /ready said it would)."""
    started, went_false, came_back, first = time.monotonic(), None, None, None
    async with httpx.AsyncClient(timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=2.0)) as client:
        while not stop.is_set() and came_back is None:
            try:
                ok = (await client.get(f"{base}/ready", timeout=2.0)).status_code == 200
            except httpx.HTTPError:
                ok = False
            now = time.monotonic() - started
            if not ok and went_false is None:
                went_false = now
            if ok and went_false is not None:
                came_back = now
                outcome = await stream_once(client, base, PROMPTS[0], refs[PROMPTS[0]])
                first = outcome.kind if outcome.kind != "lost" else f"lost: {outcome.detail}"
            await asyncio.sleep(0.05)
    return {"ready_false_after_s": went_false and round(went_false, 2),
            "ready_true_again_after_s": came_back and round(came_back, 2),
            "first_request_when_ready_again": first}


async def run_fault(fault: str, launcher: LauncherProcess, refs: dict[str, str]) -> FaultReport:
    """Load before the kill, then until the cluster serves again and LOAD_AFTER_S more."""
    base = launcher.base_url
    report, stop = FaultReport(fault), asyncio.Event()
    clients = [asyncio.create_task(load(base, refs, stop, report, i)) for i in range(CLIENTS)]
    await asyncio.sleep(LOAD_BEFORE_S)
    killed, report.killed_at = await asyncio.wait_for(asyncio.to_thread(inject, fault, launcher), 60)
    report.notes["killed"] = killed
    watcher = asyncio.create_task(watch_ready(base, refs, stop))
    try:
        await wait_serving(base, refs, RECOVER_S)
        await asyncio.sleep(LOAD_AFTER_S)
    finally:
        stop.set()
        await asyncio.gather(*clients)
        report.notes.update(await watcher)
    report.recovered_s = report.recovered_s or time.monotonic() - report.killed_at
    if fault == "router":  # the new router's index, rebuilt from the KV-event stream
        report.notes["index_blocks_after_restart"] = await metric_value(
            base, "rackserve_router_index_blocks"
        )
    return report


async def metric_value(base: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    async with httpx.AsyncClient(timeout=10.0) as client:
        text = (await client.get(f"{base}/metrics")).text
    return sum(
        s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name
    )


def start_cluster(tmp: Path) -> LauncherProcess:
    config = tmp / "chaos.yaml"
    config.write_text(CONFIG)
    cmd = launcher_command("--config", str(config), "--port", str(free_port()), "--log-dir", str(tmp / "logs"))
    return LauncherProcess(cmd).start(timeout_s=240)


def stop_with_ctrl_c(launcher: LauncherProcess, timeout_s: float = 15.0) -> tuple[int | None, float]:
    """SIGINT as a terminal's Ctrl-C sends it; (exit code, seconds) or (None, timeout)."""
    started = time.monotonic()
    launcher.proc.send_signal(signal.SIGINT)
    try:
        code = launcher.proc.wait(timeout_s)
    except Exception:
        return None, timeout_s
    return code, time.monotonic() - started


async def chaos(launcher: LauncherProcess, faults: tuple[str, ...] = FAULTS) -> list[FaultReport]:
    refs = await reference_texts(launcher.base_url)
    reports = []
    for fault in faults:
        reports.append(await run_fault(fault, launcher, refs))
    return reports


async def idle_metrics(base: str, settle_s: float = 3.0) -> dict:
    """Once the load has stopped (and every fault healed): the merged /metrics' duplicated series
    (must be none) and the load gauges, which must read idle (set from state, not from deltas)."""
    from prometheus_client.parser import text_string_to_metric_families

    await asyncio.sleep(settle_s)  # > the 1 s rank-state refresh
    async with httpx.AsyncClient(timeout=10.0) as client:
        text = (await client.get(f"{base}/metrics")).text
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    keys = Counter((s.name, frozenset(s.labels.items())) for s in samples)

    def total(name: str) -> float:
        return sum(s.value for s in samples if s.name == name)

    return {
        "duplicated_series": sum(1 for n in keys.values() if n > 1),
        "requests_running": total("vllm:num_requests_running"),
        "requests_waiting": total("vllm:num_requests_waiting"),
        "kv_cache_usage_perc": total("vllm:kv_cache_usage_perc"),
        "requests_in_flight": total("rackserve_requests_in_flight"),
        "prefix_hit_rate_series": sum(1 for s in samples if s.name == "rackserve_prefix_cache_hit_rate"),
    }
