"""The chaos run shared by tests/integration/reliability/test_chaos.py and bench/chaos.py.

A small cluster (`rackserve up`, embedded Redis) serves a steady load of concurrent greedy
streams while a fault script kills, in turn, a decode rank's Ray actor, the decode service, the
prefill service, the router and Redis; nothing is restarted by hand (the launcher's supervisor and
Ray do it). Every request is classified against a fault-free run of the same prompts:
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
FAULTS = ("rank_actor", "decode", "prefill", "router", "redis")
LOAD_BEFORE_S = 2.0  # load runs this long before the fault ...
LOAD_AFTER_S = 4.0  # ... and this long after it
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


async def load(base: str, refs: dict[str, str], until: float, report: FaultReport, idx: int) -> None:
    """One client: streams back to back until `until` (monotonic)."""
    n = idx
    async with httpx.AsyncClient(timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=2.0)) as client:
        while time.monotonic() < until:
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


def kill_rank_actor(ray_address: str) -> str:
    """Kill a decode rank's Ray actor as a crash would (Ray restarts it)."""
    for key, value in RAY_ENV.items():  # loopback-only Ray, read when ray is imported
        os.environ.setdefault(key, value)
    import ray

    ray.init(address=ray_address, log_to_driver=False, include_dashboard=False)
    try:
        return _kill_first_decode_rank(ray)
    finally:
        ray.shutdown()  # leave no driver behind for the next test in this process


def _kill_first_decode_rank(ray) -> str:
    named = ray.util.list_named_actors(all_namespaces=True)
    decode = sorted((a for a in named if a["name"].startswith("decode-")), key=lambda a: a["name"])
    assert decode, f"no decode rank actor among {named}"
    target = decode[0]
    ray.kill(ray.get_actor(target["name"], namespace=target["namespace"]), no_restart=False)
    time.sleep(0.5)  # let the kill reach the actor before this driver disconnects
    return target["name"]


def inject(fault: str, launcher: LauncherProcess) -> str:
    if fault == "rank_actor":
        return kill_rank_actor(launcher.urls["ray"])
    needle = {"decode": "-m services.decode", "prefill": "-m services.prefill",
              "router": "-m services.router", "redis": "redis-server"}[fault]
    pid = process_pid(launcher, needle)
    os.kill(pid, signal.SIGKILL)
    return f"pid {pid}"


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


async def watch_ready(base: str, seconds: float) -> dict:
    """After a Redis kill: how soon /ready turned false and true again."""
    started, went_false, came_back = time.monotonic(), None, None
    async with httpx.AsyncClient(timeout=2.0) as client:
        while time.monotonic() - started < seconds and came_back is None:
            try:
                ok = (await client.get(f"{base}/ready")).status_code == 200
            except httpx.HTTPError:
                ok = False
            now = time.monotonic() - started
            if not ok and went_false is None:
                went_false = now
            if ok and went_false is not None:
                came_back = now
            await asyncio.sleep(0.05)
    return {"ready_false_after_s": went_false and round(went_false, 2),
            "ready_true_again_after_s": came_back and round(came_back, 2)}


async def run_fault(fault: str, launcher: LauncherProcess, refs: dict[str, str]) -> FaultReport:
    base = launcher.base_url
    report = FaultReport(fault)
    until = time.monotonic() + LOAD_BEFORE_S + LOAD_AFTER_S
    clients = [asyncio.create_task(load(base, refs, until, report, i)) for i in range(CLIENTS)]
    await asyncio.sleep(LOAD_BEFORE_S)
    report.notes["killed"] = await asyncio.wait_for(asyncio.to_thread(inject, fault, launcher), 60)
    report.killed_at = time.monotonic()
    watcher = asyncio.create_task(watch_ready(base, LOAD_AFTER_S + 10)) if fault == "redis" else None
    await asyncio.gather(*clients)
    if watcher is not None:
        report.notes.update(await watcher)
    await wait_serving(base, refs, RECOVER_S)
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
