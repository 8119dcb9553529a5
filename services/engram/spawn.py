"""Start N Engram shard processes and wait for their READY lines; stop them by PID.

Used by tests and benchmarks (and usable by the launcher): `with ShardProcesses(4) as shards:
ShardedEngramTable(shards.addresses, cfg)`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from services.child_process import stop_child
from services.ready_line import read_ready

ROOT = Path(__file__).resolve().parents[2]


class ShardProcesses:
    def __init__(self, shards: int, config: str | None = None, host: str = "127.0.0.1") -> None:
        self.shards = shards
        self.config = config
        self.host = host
        self.procs: list[subprocess.Popen[str]] = []
        self.addresses: list[str] = []

    def start(self, timeout_s: float = 60.0) -> ShardProcesses:
        for i in range(self.shards):
            cmd = [sys.executable, "-m", "services.engram", "--shard", str(i), "--shards", str(self.shards),
                   "--host", self.host, "--port", "0"] + (["--config", self.config] if self.config else [])
            self.procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True,
                                               env={**os.environ, "PYTHONUNBUFFERED": "1"}))
        try:
            self.addresses = [read_ready(p, "ENGRAM READY", timeout_s)["grpc"] for p in self.procs]
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            stop_child(proc, timeout_s)
        self.procs = []

    def __enter__(self) -> ShardProcesses:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

