"""`rackserve up` as a user runs it: healthy within a bounded time, and SIGTERM leaves no process,
no listening port and none of the temp dirs it made (its logs, Redis's dir, Ray's sessions)
behind."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import pytest

from services.redis_server import free_port
from tests.e2e.launcher_proc import LauncherProcess

pytestmark = pytest.mark.e2e

UP_WITHIN_S = 240  # generous: a loaded 2-core machine starts Ray, 7 rank actors and 4 services


def listening_inodes() -> dict[int, int]:
    """socket inode -> port of every TCP socket in LISTEN state (IPv4 and IPv6)."""
    out = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                out[int(fields[9])] = int(fields[1].rsplit(":", 1)[1], 16)
    return out


def ports_of(pids: list[int]) -> set[int]:
    """Ports the processes `pids` listen on (from their open socket fds)."""
    listening = listening_inodes()
    ports = set()
    for pid in pids:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        for link in links:
            if link.startswith("socket:["):
                inode = int(link[8:-1])
                if inode in listening:
                    ports.add(listening[inode])
    return ports


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def own_temp_dirs(pids: list[int]) -> dict[str, Path]:
    """The temp dirs the launcher's Redis and Ray head run in, from their command lines."""
    dirs = {}
    for pid in pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        temp = [a.split("=", 1)[1] for a in argv if a.startswith("--temp-dir=")]
        if "start" in argv and "--head" in argv and temp:  # `ray start --head --temp-dir=...`
            dirs["ray"] = Path(temp[0])
        if "redis-server" in argv[0]:  # it retitles itself; it runs in its --dir
            dirs["redis"] = Path(os.readlink(f"/proc/{pid}/cwd"))
    return dirs


def test_rackserve_up_is_healthy_and_sigterm_leaves_nothing() -> None:
    rackserve = str(Path(sys.executable).with_name("rackserve"))
    port = free_port()
    proc = LauncherProcess(
        [rackserve, "up", "--port", str(port)], env={"RACKSERVE_CLUSTER__TIME_SCALE": "0.002"}
    )
    proc.start(timeout_s=UP_WITHIN_S)
    try:
        base = f"http://127.0.0.1:{port}"
        assert proc.base_url == base
        assert httpx.get(f"{base}/ready", timeout=10).status_code == 200
        reply = httpx.post(
            f"{base}/v1/completions",
            timeout=60,
            json={
                "model": "rackserve-moe-small",
                "prompt": "up",
                "max_tokens": 2,
                "ignore_eos": True,
            },
        )
        assert reply.json()["usage"]["completion_tokens"] == 2
        pids = [proc.proc.pid, *proc.descendants()]
        ports = ports_of(pids)
        assert (
            port in ports and len(pids) >= 10
        )  # redis, ray head + node, pool, prefill, decode, router, actors
        dirs = {"logs": proc.log_dir, **own_temp_dirs(pids)}
        assert set(dirs) == {"logs", "ray", "redis"}, dirs
        assert all(d.is_dir() for d in dirs.values()), dirs
        assert list(dirs["ray"].glob("session_*")), "Ray's sessions are not in its own temp dir"
    finally:
        code = proc.stop()
    assert code == 0, "".join(proc.lines)[-3000:]
    assert [p for p in pids if alive(p)] == []
    assert ports & set(listening_inodes().values()) == set()
    assert "rackserve stopped" in "".join(proc.lines)
    assert [d for d in dirs.values() if d.exists()] == []
