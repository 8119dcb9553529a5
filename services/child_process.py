"""Stop a child process we started, by PID: SIGTERM, wait, then SIGKILL (never by name)."""

from __future__ import annotations

import subprocess


def stop_child(proc: subprocess.Popen, timeout_s: float = 10.0) -> int:
    """Terminate `proc` (if still running), escalate to SIGKILL after `timeout_s`; return its exit code."""
    if proc.poll() is None:
        proc.terminate()
    try:
        code = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    if proc.stdout:
        proc.stdout.close()
    return code
