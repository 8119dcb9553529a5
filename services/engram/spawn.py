"""Start N Engram shard processes and wait for their READY lines; stop them by PID.

Used by tests and benchmarks (and usable by the launcher): `with ShardProcesses(4) as shards:
ShardedEngramTable(shards.addresses, cfg)`.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

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
            self.addresses = [_ready_address(p, timeout_s) for p in self.procs]
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout:
                proc.stdout.close()
        self.procs = []

    def __enter__(self) -> ShardProcesses:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _ready_address(proc: subprocess.Popen[str], timeout_s: float) -> str:
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not sel.select(timeout=0.5):
            continue
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"engram shard exited with {proc.wait()} before it was ready")
        if line.startswith("ENGRAM READY"):
            fields = dict(part.split("=", 1) for part in line.split()[2:])
            return fields["grpc"]
    raise RuntimeError("engram shard did not print its READY line in time")
