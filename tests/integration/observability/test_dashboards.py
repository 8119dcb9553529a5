"""Grafana provisioning and dashboards: structure, freshness, PromQL syntax (real promtool),
and every metric a panel reads is one rackserve.metrics defines."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rackserve.metrics import ProcessMetrics
from services.prometheus_server import MISSING

ROOT = Path(__file__).resolve().parents[3]
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
PANEL_TYPES = {"timeseries", "heatmap", "stat", "bargauge"}


def _builder():
    spec = importlib.util.spec_from_file_location(
        "build_dashboards", GRAFANA / "build_dashboards.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def all_exprs() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, PromQL with $__rate_interval as 1m) for every panel target."""
    out = []
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel["targets"]:
                out.append(
                    (path.name, panel["title"], target["expr"].replace("$__rate_interval", "1m"))
                )
    return out


def test_the_four_dashboards_exist_and_match_their_builder():
    assert [p.name for p in DASHBOARDS] == [
        "cache.json",
        "overview.json",
        "ranks.json",
        "router.json",
    ]
    rendered = _builder().render()
    for path in DASHBOARDS:
        assert path.read_text() == rendered[path.name], (
            f"{path.name} is stale: run build_dashboards.py"
        )


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_structure(path):
    d = json.loads(path.read_text())
    assert d["uid"].startswith("rackserve-") and d["title"] and d["schemaVersion"] >= 36
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)) and len(ids) >= 4
    for panel in d["panels"]:
        assert panel["type"] in PANEL_TYPES, panel["title"]
        assert panel["datasource"]["uid"] == "rackserve-prometheus"
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]) and panel["gridPos"]["w"] <= 24
        assert panel["targets"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids))
        assert all(t["expr"].strip() for t in panel["targets"])


def test_required_panels_are_present():
    titles = {p.name: [x["title"] for x in json.loads(p.read_text())["panels"]] for p in DASHBOARDS}
    need = {
        "overview.json": ["TTFT P50 / P90", "Throughput per GPU vs tok/s per user", "Requests"],
        "cache.json": ["Prefix hit rate by tier", "Pool occupancy", "Pool evictions/s"],
        "ranks.json": [
            "Idle time at the lockstep barrier (instance x rank)",
            "Batch size per rank",
        ],
        "router.json": [
            "Decision latency P50 / P90 (wall)",
            "Predicted vs delivered cached tokens/s",
        ],
    }
    for name, wanted in need.items():
        assert set(wanted) <= set(titles[name]), name
    heat = next(
        p
        for p in json.loads((GRAFANA / "dashboards" / "ranks.json").read_text())["panels"]
        if p["type"] == "heatmap"
    )
    assert "instance" in heat["targets"][0]["expr"] and "dp_rank" in heat["targets"][0]["expr"]


def test_provisioning_points_at_the_dashboards_and_datasource():
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert ds["datasources"][0]["uid"] == "rackserve-prometheus"
    assert ds["datasources"][0]["type"] == "prometheus"
    prov = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "rackserve.yml").read_text())
    assert prov["providers"][0]["type"] == "file" and prov["providers"][0]["options"]["path"]


def _family_names() -> set[str]:
    names = set()
    for family in ProcessMetrics("m").registry.collect():
        base = family.name
        names.add(base)
        if family.type == "counter":
            names.add(f"{base}_total")
        if family.type == "histogram":
            names.update({f"{base}_bucket", f"{base}_sum", f"{base}_count"})
    return names


def test_every_metric_a_panel_reads_is_defined_in_rackserve_metrics():
    defined = _family_names()
    for name, title, expr in all_exprs():
        used = set(re.findall(r"\b((?:rackserve_|vllm:)[a-z0-9_:]+)", expr))
        assert used, (name, title)
        assert used <= defined, (name, title, used - defined)


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason=MISSING
)
def test_every_expression_is_valid_promql(tmp_path):
    rules = {
        "groups": [
            {
                "name": "dashboards",
                "rules": [
                    {"record": f"rackserve:panel_{i}", "expr": e}
                    for i, (_, _, e) in enumerate(all_exprs())
                ],
            }
        ]
    }
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(all_exprs())} rules found" in result.stdout
