"""The embedded Redis leaves no temp dir behind: every test fixture and `rackserve up` stop it,
and a stop removes the dir it ran in (also after a crash and a restart on its port)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.redis_server import RedisServer

pytestmark = pytest.mark.integration


def _dir_of(server: RedisServer) -> Path:
    """The dir the server runs in (Redis changes into its --dir): the process says, not our object."""
    return Path(os.readlink(f"/proc/{server.pid}/cwd"))


def test_stop_removes_the_redis_temp_dir() -> None:
    with RedisServer() as server:
        run_dir = _dir_of(server)
        assert (run_dir / "redis.log").exists()
    assert not run_dir.exists()


def test_a_crashed_and_revived_redis_still_leaves_nothing() -> None:
    with RedisServer() as server:
        run_dir = _dir_of(server)
        server.kill()
        server.revive()
        assert _dir_of(server) == run_dir  # the same dir across the restart
    assert not run_dir.exists()
