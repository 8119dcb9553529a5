"""Start and stop a real Prometheus (Debian's `prometheus` binary) that scrapes the live services.

The config is generated from the scrape targets the launcher knows (job -> host:port list); the
server binds 127.0.0.1 on a port chosen here, keeps its TSDB in a temporary folder, and is stopped
by PID. `query()` runs an instant PromQL query over the HTTP API (used by tests and `bench`).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from services.child_process import stop_child
from services.redis_server import free_port

SCRAPE_INTERVAL_S = 1.0  # the twin's time runs fast: scrape often so short runs show up


INSTALL_HINT = "apt-get install -y --no-install-recommends prometheus (prometheus and promtool)"
MISSING = f"Prometheus not on PATH; get it with: {INSTALL_HINT}"  # every skip for it says this


def binary() -> str | None:
    """Path of the prometheus binary, or None when it is not installed."""
    return shutil.which("prometheus")


def render_config(
    targets: Mapping[str, Sequence[str]], scrape_interval_s: float = SCRAPE_INTERVAL_S
) -> str:
    """prometheus.yml text scraping each job's host:port targets.

    `honor_labels: true` keeps our own `instance` label (the engine instance) instead of renaming
    it `exported_instance`; series without it get the target address as usual.
    """
    for job, addrs in targets.items():
        if not job or not all(":" in a for a in addrs):
            raise ValueError(f"targets[{job!r}]: expected host:port addresses, got {list(addrs)}")
    interval = f"{int(scrape_interval_s * 1000)}ms"
    doc = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {
                "job_name": job,
                "honor_labels": True,
                "metrics_path": "/metrics",
                "static_configs": [{"targets": list(addrs)}],
            }
            for job, addrs in targets.items()
        ],
    }
    return yaml.safe_dump(doc, sort_keys=False)


@dataclass
class PrometheusServer:
    """One prometheus process. `start()` waits for /-/ready; data arrives ~5 s later (discovery)."""

    targets: Mapping[str, Sequence[str]]
    port: int = 0
    retention: str = "2h"
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _dir: str | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self, timeout_s: float = 20.0) -> PrometheusServer:
        assert self._proc is None, "already running"
        exe = binary()
        if exe is None:
            raise RuntimeError("prometheus binary not found: apt-get install prometheus")
        if self.port == 0:
            self.port = free_port()
        self._dir = self._dir or tempfile.mkdtemp(prefix="rackserve-prometheus-")
        config = Path(self._dir) / "prometheus.yml"
        config.write_text(render_config(self.targets))
        args = [
            exe,
            f"--config.file={config}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            f"--storage.tsdb.path={Path(self._dir) / 'data'}",
            f"--storage.tsdb.retention.time={self.retention}",
        ]
        log = open(Path(self._dir) / "prometheus.log", "ab")  # noqa: SIM115 - owned by the child
        self._proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        log.close()
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=1.0) as client:
            while time.monotonic() < deadline:
                if self._proc is not None and self._proc.poll() is not None:
                    raise RuntimeError(
                        f"prometheus exited with {self._proc.returncode}; see {self._dir}/prometheus.log"
                    )
                try:
                    if client.get(f"{self.url}/-/ready").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        raise RuntimeError(f"prometheus on port {self.port} not ready after {timeout_s}s")

    def query(self, promql: str, client: httpx.Client | None = None) -> list[dict[str, Any]]:
        """Instant query; returns the `result` list (raises on a PromQL error)."""
        own = client is None
        client = client or httpx.Client(timeout=5.0)
        try:
            resp = client.get(f"{self.url}/api/v1/query", params={"query": promql})
        finally:
            if own:
                client.close()
        body = resp.json()
        if body.get("status") != "success":
            raise ValueError(f"PromQL {promql!r}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]["result"]

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop our process by PID (SIGTERM, then SIGKILL) and drop its temporary data."""
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        stop_child(proc, timeout_s)
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def cluster_targets(
    host: str, router_http_port: int, pool_metrics_port: int | None = None
) -> dict[str, list[str]]:
    """Scrape targets of a local cluster: the router (its /metrics merges the prefill and decode
    workers, so they are not scraped twice) and the KV pool."""
    targets = {"router": [f"{host}:{router_http_port}"]}
    if pool_metrics_port:
        targets["kvpool"] = [f"{host}:{pool_metrics_port}"]
    return targets


def start_if_available(
    targets: Mapping[str, Sequence[str]], port: int = 0
) -> PrometheusServer | None:
    """What `rackserve up` does: a Prometheus when the binary is installed, else None (and a note)."""
    if binary() is None:
        return None
    return PrometheusServer(targets, port=port).start()
