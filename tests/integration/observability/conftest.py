"""Fixtures of the observability tests: the live cluster, a real Prometheus scraping it, and one
benchmark run (the bench CLI as a subprocess) that drives load for every test of the module."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.prometheus_server import MISSING, PrometheusServer, binary
from services.redis_server import free_port

ROOT = Path(__file__).resolve().parents[3]
BENCH_REQUESTS = 32


@dataclass(frozen=True)
class LiveCluster:
    base_url: str  # the router's front door, http://127.0.0.1:PORT
    scrape_targets: dict[str, list[str]]  # Prometheus job -> host:port
    prometheus_url: str | None = None  # the one `rackserve up` started, if it did


def _kvpool_metrics(log_dir: Path) -> list[str]:
    text = (
        (log_dir / "kvpool.log").read_text(errors="replace")
        if (log_dir / "kvpool.log").exists()
        else ""
    )
    found = re.search(r"KVPOOL READY .*metrics=(\S+)", text)
    return [found.group(1)] if found else []


@pytest.fixture(scope="session")
def obs_cluster(request, tmp_path_factory):
    """The session's shared `live_cluster` (tests/conftest.py); without it, our own `rackserve up`."""
    try:
        live = request.getfixturevalue("live_cluster")
        base_url, log_dir, own = live.base_url, Path(live.log_dir), None
        prom_url = live.urls.get("prometheus")
    except pytest.FixtureLookupError:
        base_url, log_dir, own, prom_url = _own_launcher(tmp_path_factory.mktemp("rackserve-up"))
    targets = {"router": [base_url.removeprefix("http://")]}
    if pool := _kvpool_metrics(log_dir):
        targets["kvpool"] = pool
    yield LiveCluster(base_url, targets, prom_url)
    if own is not None:
        own.send_signal(signal.SIGTERM)
        try:
            own.wait(90)
        except subprocess.TimeoutExpired:
            own.kill()
            own.wait(10)


def _own_launcher(log_dir: Path) -> tuple[str, Path, subprocess.Popen, str | None]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.launcher", "--port", str(port), "--log-dir", str(log_dir)],
        cwd=ROOT, env={**os.environ, "RACKSERVE_CLUSTER__TIME_SCALE": "0.01"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines, up = [], False
    for line in proc.stdout:  # type: ignore[union-attr]
        lines.append(line)
        up = up or line.startswith("rackserve is up")
        if up and line.strip().startswith("logs"):
            urls = dict(x.strip().rsplit(None, 1) for x in lines if x.startswith("  "))
            return f"http://127.0.0.1:{port}", log_dir, proc, urls.get("prometheus")
    proc.wait(90)
    pytest.fail("rackserve up exited before it was up:\n" + "".join(lines[-40:]))


@pytest.fixture(scope="session")
def prometheus(obs_cluster):
    if binary() is None:
        pytest.skip(MISSING)
    if obs_cluster.prometheus_url:  # `rackserve up` started one: query it (it stops it itself)
        yield PrometheusServer(
            obs_cluster.scrape_targets, port=int(obs_cluster.prometheus_url.rsplit(":", 1)[1])
        )
        return
    server = PrometheusServer(obs_cluster.scrape_targets).start()
    yield server
    server.stop()


def small_trace(path: Path, n: int) -> Path:
    """n requests in 4 groups sharing a 2-block prefix (prefix-cache hits), 128 output tokens each (32 at length scale 0.25)."""
    with path.open("w") as f:
        for i in range(n):
            group = i % 4
            record = {"timestamp": 100 * i, "input_length": 1400, "output_length": 128,
                      "hash_ids": [1000 + group, 2000 + group, 3000 + i]}  # fmt: skip
            f.write(json.dumps(record) + "\n")
    return path


@pytest.fixture(scope="session")
def bench_run(obs_cluster, prometheus, tmp_path_factory):
    """One `python -m services.bench` run against the cluster (with Prometheus already scraping)."""
    out = tmp_path_factory.mktemp("bench")
    trace = small_trace(out / "trace.jsonl", BENCH_REQUESTS)
    cmd = [sys.executable, "-m", "services.bench", "--url", obs_cluster.base_url, "--trace", str(trace),
           "--length-scale", "0.25", "--concurrency", "8", "--save-result", "--result-dir", str(out),
           "--result-filename", "result.json", "--plot", str(out / "plots"), "--no-progress"]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    return {
        "proc": done,
        "dir": out,
        "wall_s": time.monotonic() - started,
        "url": obs_cluster.base_url,
    }
