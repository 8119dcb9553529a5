"""Static checks of docker-compose.yml (and the no-registry override): it validates with
docker-compose, publishes only the router API (and Grafana's UI) on 127.0.0.1, gates every start on
healthchecks, keeps one internal network, and runs commands the services' own parsers accept."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from rackserve.config import load_config

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
OVERRIDE = ROOT / "deploy" / "docker" / "compose.local.yml"
PROJECT_SERVICES = {"ray-head", "kvpool", "prefill", "decode", "router"}  # + engram-* shards
PUBLISHING = {"router", "grafana"}
BIND = "${RACKSERVE_BIND:-127.0.0.1}"


def _services() -> dict[str, dict[str, Any]]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def _project(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in services.items() if n in PROJECT_SERVICES or n.startswith("engram")}


def _compose_env() -> dict[str, str]:
    return {**os.environ, "GRAFANA_ADMIN_PASSWORD": "static-check"}


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed "
                    "(apt-get install -y --no-install-recommends docker-compose)")
@pytest.mark.parametrize("files", [[COMPOSE], [COMPOSE, OVERRIDE]], ids=["base", "local-override"])
def test_docker_compose_config_validates(files: list[Path]) -> None:
    args = [a for f in files for a in ("-f", str(f))]
    done = subprocess.run(["docker-compose", *args, "config", "-q"], cwd=ROOT, env=_compose_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_grafana_password_has_no_default() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRAFANA_ADMIN_PASSWORD"}
    done = subprocess.run(["docker-compose", "config", "-q"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "GRAFANA_ADMIN_PASSWORD" in done.stderr


def test_only_router_and_grafana_publish_ports_on_loopback() -> None:
    services = _services()
    publishing = {name for name, svc in services.items() if svc.get("ports")}
    assert publishing == PUBLISHING
    for name in publishing:
        for port in services[name]["ports"]:
            assert port.startswith(f"{BIND}:"), f"{name}: {port} must bind {BIND}"
    assert "expose" not in services["redis"] and "ports" not in services["redis"]


def test_every_service_has_a_healthcheck_and_waits_for_healthy_dependencies() -> None:
    services = _services()
    for name, svc in services.items():
        test = svc.get("healthcheck", {}).get("test")
        assert test and test[0] == "CMD", f"{name}: healthcheck.test missing"
        for dep, cond in svc.get("depends_on", {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            assert cond == {"condition": "service_healthy"}, f"{name} -> {dep}: {cond}"


def test_one_internal_network() -> None:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert list(doc["networks"]) == ["rackserve"]
    for name, svc in doc["services"].items():
        assert svc.get("networks") == ["rackserve"], name
        assert svc.get("network_mode") is None, name


def test_redis_persistence_off_by_default() -> None:
    command = _services()["redis"]["command"]
    assert command[command.index("--save") + 1] == ""
    assert command[command.index("--appendonly") + 1] == "${REDIS_APPENDONLY:-no}"


def test_project_services_share_image_scenario_and_env() -> None:
    services = _services()
    project = _project(services)
    assert PROJECT_SERVICES <= set(project)
    for name, svc in project.items():
        assert svc["image"] == "${RACKSERVE_IMAGE:-rackserve:latest}", name
        assert svc["build"]["context"] == ".", name
        mounts = [v for v in svc.get("volumes", []) if isinstance(v, dict)]
        assert any(m["target"] == "/etc/rackserve/scenario.yaml" and m["read_only"] for m in mounts), name
        env = svc["environment"]
        assert env["RACKSERVE_CLUSTER__REDIS_URL"] == "redis://redis:6379/0", name
        assert env["RACKSERVE_CLUSTER__RAY_ADDRESS"] == "ray-head:6379", name
        assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "1", name  # bind the node IP, not loopback
        if "0.0.0.0" in svc["command"]:
            assert env["RACKSERVE_CLUSTER__PUBLIC_BIND"] == "true", name  # else the service refuses
    cluster = load_config(environ={"RACKSERVE_CLUSTER__PUBLIC_BIND": "true", "RACKSERVE_CLUSTER__API_KEY": ""}).cluster
    assert cluster.public_bind and cluster.api_key is None  # an unset RACKSERVE_API_KEY means no key


def test_grafana_anonymous_viewer_and_provisioning() -> None:
    grafana = _services()["grafana"]
    env = grafana["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true" and env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert env["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")
    sources = {m["source"]: m for m in grafana["volumes"]}
    for source in ("./deploy/grafana/provisioning", "./deploy/grafana/dashboards"):
        assert (ROOT / source).is_dir() and sources[source]["read_only"], source


def test_default_scenario_loads() -> None:
    cfg = load_config(ROOT / "deploy" / "docker" / "scenario.yaml")
    assert cfg.deployment.prefill and cfg.deployment.decode


def test_override_swaps_every_registry_image_but_grafana() -> None:
    override = yaml.safe_load(OVERRIDE.read_text())["services"]
    registry = {n for n, s in _services().items() if "build" not in s}
    assert registry - set(override) == {"grafana"}
    for name in registry - {"grafana"}:
        assert override[name]["image"] == "rackserve-base:bookworm", name
    for name in PROJECT_SERVICES:
        assert override[name]["build"]["args"]["OFFLINE_WHEELS"] == "1", name
