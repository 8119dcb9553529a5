"""docker-compose.yml restarts what dies, as `rackserve up` does: every long-running service has a
restart policy that brings a crashed container back (Docker backs off, doubling from 100 ms)."""

from __future__ import annotations

from pathlib import Path

import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
RESTARTING = {"always", "unless-stopped", "on-failure"}


def test_every_service_comes_back_after_a_crash() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    missing = {name: svc.get("restart") for name, svc in services.items()
               if svc.get("restart") not in RESTARTING}
    assert not missing, f"services without a restart policy: {missing}"
    for name in ("redis", "kvpool", "prefill", "decode", "router", "ray-head", "engram-0"):
        assert name in services
