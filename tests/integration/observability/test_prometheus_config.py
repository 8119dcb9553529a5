"""deploy/prometheus/prometheus.yml and generated configs: valid for the real promtool, and in
sync with the services docker-compose.yml runs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from services.prometheus_server import MISSING, render_config

ROOT = Path(__file__).resolve().parents[3]
STATIC = ROOT / "deploy" / "prometheus" / "prometheus.yml"
needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason=MISSING
)


def _targets(doc: dict) -> set[str]:
    return {
        t for job in doc["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]
    }


def _compose_metrics_targets() -> set[str]:
    """Every compose service's metrics endpoint, minus the workers the router already merges."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    found, merged = set(), set()
    for name, svc in compose["services"].items():
        cmd = [str(c) for c in svc.get("command") or []]
        if "--metrics-port" in cmd:
            found.add(f"{name}:{cmd[cmd.index('--metrics-port') + 1]}")
        if "--http-port" in cmd:
            found.add(f"{name}:{cmd[cmd.index('--http-port') + 1]}")
        if "--worker-metrics" in cmd:
            for url in cmd[cmd.index("--worker-metrics") + 1 :]:
                if url.startswith("http"):
                    merged.add(urlparse(url).netloc)
    return found - merged


def test_static_config_scrapes_every_compose_service_once():
    doc = yaml.safe_load(STATIC.read_text())
    assert _targets(doc) == _compose_metrics_targets()
    assert all(job["honor_labels"] for job in doc["scrape_configs"])


@needs_promtool
def test_static_config_is_valid():
    result = subprocess.run(
        ["promtool", "check", "config", str(STATIC)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_generated_config_is_valid(tmp_path):
    path = tmp_path / "prometheus.yml"
    path.write_text(
        render_config(
            {"router": ["127.0.0.1:8000"], "kvpool": ["127.0.0.1:9101", "127.0.0.1:9102"]}
        )
    )
    result = subprocess.run(
        ["promtool", "check", "config", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    doc = yaml.safe_load(path.read_text())
    assert _targets(doc) == {"127.0.0.1:8000", "127.0.0.1:9101", "127.0.0.1:9102"}
    assert doc["global"]["scrape_interval"] == "1000ms"


def test_generated_config_rejects_addresses_without_port():
    with pytest.raises(ValueError, match="host:port"):
        render_config({"router": ["localhost"]})
