"""Run `rackserve up` (the launcher) as a subprocess for tests: wait for its URLs, stop it by PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from services.launcher import descendants

UP_LINE = "rackserve is up:"


@dataclass
class LauncherProcess:
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    lines: list[str] = field(default_factory=list)
    urls: dict[str, str] = field(default_factory=dict)

    def start(self, timeout_s: float) -> LauncherProcess:
        self.proc = subprocess.Popen(
            self.args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, **self.env},
        )
        threading.Thread(target=self._pump, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._parse_urls():
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        output = "".join(self.lines)[-4000:]
        self.stop()
        raise RuntimeError(f"launcher not up within {timeout_s} s:\n{output}")

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def _parse_urls(self) -> bool:
        text = list(self.lines)
        if not any(UP_LINE in line for line in text):
            return False
        start = next(i for i, line in enumerate(text) if UP_LINE in line)
        for line in text[start + 1 :]:
            parts = line.strip().rsplit(None, 1)
            if len(parts) == 2 and line.startswith("  "):
                self.urls[parts[0].strip()] = parts[1]
        return "logs" in self.urls

    @property
    def base_url(self) -> str:
        return self.urls["OpenAI API"].removesuffix("/v1")

    @property
    def log_dir(self) -> Path:
        return Path(self.urls["logs"])

    def descendants(self) -> list[int]:
        assert self.proc is not None
        return descendants(self.proc.pid)

    def stop(self, timeout_s: float = 90.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def launcher_command(*extra: str) -> list[str]:
    return [sys.executable, "-m", "services.launcher", *extra]
