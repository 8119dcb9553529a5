"""Run the pool service as a child process (benchmarks, tests): `with PoolProcess(url) as pool:`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from services.child_process import stop_child
from services.ready_line import read_ready

ROOT = Path(__file__).resolve().parents[2]


class PoolProcess:
    def __init__(self, redis_url: str, extra_args: tuple[str, ...] = ()) -> None:
        self.redis_url = redis_url
        self.extra_args = extra_args
        self.proc: subprocess.Popen[str] | None = None
        self.address = self.metrics_address = ""

    def start(self, timeout_s: float = 60.0) -> PoolProcess:
        cmd = [sys.executable, "-m", "services.kvpool", "--redis-url", self.redis_url, "--port", "0",
               "--metrics-port", "0", *self.extra_args]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            fields = read_ready(self.proc, "KVPOOL READY", timeout_s)
        except BaseException:
            self.stop()
            raise
        self.address, self.metrics_address = fields["grpc"], fields["metrics"]
        return self

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM by PID (SIGKILL after `timeout_s`). Returns the exit code."""
        if self.proc is None:
            return None
        proc, self.proc = self.proc, None
        return stop_child(proc, timeout_s)

    def __enter__(self) -> PoolProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
