"""Shared fixtures: real servers started once per test session, stopped by PID."""

from __future__ import annotations

import os

# Every local Ray run binds to loopback and stays offline (see ../shared/ENVIRONMENT.md).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


# --- Redis (issue 4): one embedded server per session, shared by every integration test. ---
import pytest  # noqa: E402

from services.redis_server import RedisServer  # noqa: E402


@pytest.fixture(autouse=True)
def _no_step_store_between_tests(monkeypatch):
    """`rackserve sim` and `sim frontier` name a step store in the environment (for a search's Ray
    workers): each test starts without one, and what a test's CLI run set is taken back after it."""
    monkeypatch.delenv("RACKSERVE_STEP_STORE", raising=False)


@pytest.fixture(scope="session")
def redis_process():
    """The session's RedisServer object: `.url`, `.port`, `.restart_empty()` (same port, no data)."""
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_server(redis_process) -> str:
    """URL of the session's real Redis server (redis://127.0.0.1:PORT/0). Use your own key prefix."""
    return redis_process.url


@pytest.fixture
def private_redis():
    """A Redis server of this test alone (for fault tests that kill/restart it): `.restart_empty()`."""
    server = RedisServer().start()
    yield server
    server.stop()


# --- Live cluster (issue 5): ONE `rackserve up` per session (Redis, Ray, pool, prefill, decode, router). ---
from tests.e2e.launcher_proc import LauncherProcess, launcher_command  # noqa: E402

CLUSTER_TIME_SCALE = "0.002"  # wall s per simulated s: paced, but quick


@pytest.fixture(scope="session")
def live_cluster():
    """The session's whole cluster from scenarios/local.yaml: `.base_url`, `.urls`, `.log_dir`."""
    from services.redis_server import free_port

    proc = LauncherProcess(launcher_command("--port", str(free_port())),
                           env={"RACKSERVE_CLUSTER__TIME_SCALE": CLUSTER_TIME_SCALE})
    proc.start(timeout_s=240)
    yield proc
    proc.stop()


# --- Prometheus: its tests skip when the binary is absent; the summary says so out loud. ---
def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ARG001
    from services.prometheus_server import MISSING

    skipped = [r for r in terminalreporter.stats.get("skipped", []) if MISSING in str(r.longrepr)]
    if skipped:
        terminalreporter.section("PROMETHEUS TESTS NOT RUN", sep="!", red=True, bold=True)
        terminalreporter.line(f"{len(skipped)} test(s) skipped. {MISSING}", red=True, bold=True)
