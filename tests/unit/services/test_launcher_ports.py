"""`rackserve up` on a taken port fails fast naming the port and its holder, and waits for its own
router's /ready, not for another cluster answering on the same port (issue 34)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from services import launcher
from services.port_check import PortInUse, check_free
from services.supervisor import Child


@pytest.fixture
def held_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_check_free_names_the_port_and_this_process(held_port: int) -> None:
    with pytest.raises(PortInUse) as err:
        check_free("127.0.0.1", {"front door HTTP": held_port})
    assert f"front door HTTP port {held_port}" in str(err.value)
    assert f"pid {os.getpid()}" in str(err.value)


def test_up_on_a_taken_port_starts_nothing(held_port, monkeypatch, capsys) -> None:
    def must_not_start(*_: object) -> None:
        raise RuntimeError("started although the port is taken")

    monkeypatch.setattr(launcher.Cluster, "start", must_not_start)
    assert launcher.main(["--port", str(held_port)]) == 2
    err = capsys.readouterr().err
    assert f"port {held_port}" in err and f"pid {os.getpid()}" in err


def test_a_taken_port_is_reported_before_the_time_scale_probe_runs(held_port, monkeypatch, capsys):
    """The ~4 s probe of --time-scale auto runs only once the ports are known to be free."""
    from services import time_scale_probe

    probed: list[object] = []
    monkeypatch.setattr(time_scale_probe, "probe", lambda cfg: probed.append(cfg))
    monkeypatch.setenv("RACKSERVE_CLUSTER__TIME_SCALE", "1")  # restored after the test
    monkeypatch.delenv("RACKSERVE_CLUSTER__TIME_SCALE")
    assert launcher.main(["--port", str(held_port), "--time-scale", "auto"]) == 2
    assert probed == []
    assert f"port {held_port}" in capsys.readouterr().err


class _OtherCluster(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = b'{"ready": true, "instance": "someone-else"}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


def test_wait_http_ignores_another_clusters_ready(tmp_path) -> None:
    server = HTTPServer(("127.0.0.1", 0), _OtherCluster)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    child = Child("router", ["sleep", "30"], dict(os.environ), tmp_path / "router.log").launch()
    url = f"http://127.0.0.1:{server.server_port}/ready"
    try:
        with pytest.raises(TimeoutError, match="someone-else"):
            launcher.wait_http(child, url, "ours", time.monotonic() + 1.0)
        launcher.wait_http(child, url, "someone-else", time.monotonic() + 5.0)
    finally:
        server.shutdown()
        child.proc.kill()
        child.proc.wait()


def test_free_ports_are_distinct_bindable_and_below_the_kernels_ephemeral_range() -> None:
    """The launcher plans its ports before Ray starts and binds them after: ports from the kernel's
    ephemeral range could be handed to one of Ray's sockets in between, so free_port picks below it."""
    from services import redis_server

    low = redis_server._ephemeral_low()
    ports = [redis_server.free_port() for _ in range(40)]
    assert len(set(ports)) == len(ports)
    if low - 1 - redis_server._LOW_PORT >= 1000:
        assert all(redis_server._LOW_PORT <= p < low for p in ports)
    for p in ports[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", p))
