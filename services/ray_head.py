"""The local Ray head `rackserve up` runs (`ray start --head --block`): its command line, a temp dir
of its own for Ray's sessions and logs (removed when the launcher stops), and when it is ready.

`ray start --block` exits once any Ray process it started dies (it kills the rest first), so the
loss of the GCS is the loss of this child: the supervisor restarts it on the same port and then
the services whose rank actors lived in it (services/supervisor.py, `needs`).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from services.redis_server import free_port
from services.supervisor import Child, Supervised

RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    # Every lockstep step is a Ray actor call and Ray's GCS keeps events of up to 100k tasks by
    # default (a 10-minute soak grew the GCS by ~316 MiB); the twin reads none of them.
    "RAY_task_events_max_num_task_in_gcs": "10000",
}
READY_MARKER = "Ray runtime started"  # printed once the node is up (the GCS listens before)


@dataclass
class RayHead:
    """One local Ray head: `launch()` (again after a death), `ready()`, `remove_temp_dir()`."""

    child: Child
    port: int
    temp_dir: Path
    _log_offset: int = 0  # where this launch's output starts in the (appended) log

    @classmethod
    def plan(cls, log_dir: Path, num_cpus: int | None = None) -> RayHead:
        """Ports and a fresh temp dir; Ray's fixed default ports (client server 10001, dashboard
        agent 52365, autoscaler metrics 44217) moved to free ones so two local clusters (e.g.
        tests) can run side by side."""
        port = free_port()
        temp_dir = Path(tempfile.mkdtemp(prefix="rackserve-ray-"))
        env = {**os.environ, **RAY_ENV, "AUTOSCALER_METRIC_PORT": str(free_port())}
        argv = [
            ray_binary(),
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={num_cpus or os.cpu_count() or 2}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={temp_dir}",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
        ]
        return cls(Child("ray", argv, env, log_dir / "ray.log"), port, temp_dir)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def launch(self) -> RayHead:
        self._log_offset = self.child.log_path.stat().st_size if self.child.log_path.exists() else 0
        self.child.launch()
        return self

    def ready(self) -> bool:
        """Running, its GCS port open and this launch's log saying the node is up."""
        if not self.child.alive() or READY_MARKER not in self._log_since_launch():
            return False
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def _log_since_launch(self) -> str:
        with open(self.child.log_path, "rb") as log:
            log.seek(self._log_offset)
            return log.read().decode(errors="replace")

    def supervised(self) -> Supervised:
        child = self.child
        return Supervised(
            "ray", child.alive, self.launch, lambda: child.started_at, lambda: child.returncode,
            ready=self.ready,
        )

    def remove_temp_dir(self) -> None:
        """Ray's session dirs (logs, sockets, spilled objects) of this head, and nothing else."""
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def ray_binary() -> str:
    """The venv's `ray`, else the one on PATH."""
    ray_bin = Path(sys.executable).with_name("ray")
    return str(ray_bin if ray_bin.exists() else Path(shutil.which("ray") or "ray"))
