"""`rackserve timing` and `rackserve timing curve` through the real typer app."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rackserve.cli import app

runner = CliRunner()


def test_step_json_has_total_and_breakdown():
    res = runner.invoke(
        app,
        [
            "timing",
            "--hardware",
            "vr200",
            "--model",
            "deepseek-v4.1-flash",
            "--layout",
            "dep2",
            "--phase",
            "prefill",
            "--tokens",
            "8192",
            "--cached",
            "6144",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["total_s"] > 0 and out["total_s"] == sum(out["breakdown"].values())
    assert {"moe_gemm", "attention", "dispatch_combine", "mhc", "lm_head"} <= set(out["breakdown"])


def test_step_table_and_switches():
    base = runner.invoke(
        app,
        [
            "timing",
            "--layout",
            "wide-ep",
            "--ranks",
            "16",
            "--phase",
            "decode",
            "--batch",
            "64",
            "--context",
            "32768",
            "--opt",
            "baseline",
            "--json",
        ],
    )
    one = runner.invoke(
        app,
        [
            "timing",
            "--layout",
            "wide-ep",
            "--ranks",
            "16",
            "--phase",
            "decode",
            "--batch",
            "64",
            "--context",
            "32768",
            "--opt",
            "baseline,+fp8xfp4-k64,+domain-local",
            "--json",
        ],
    )
    assert json.loads(one.output)["total_s"] < json.loads(base.output)["total_s"]
    assert json.loads(one.output)["optimizations"] == ["domain-local", "fp8xfp4-k64"]
    table = runner.invoke(app, ["timing", "--layout", "tp8", "--phase", "decode", "--batch", "4"])
    assert table.exit_code == 0 and "all_reduce" in table.output and "total" in table.output


def test_curve_rows_follow_interactivity_definition():
    res = runner.invoke(
        app,
        [
            "timing",
            "curve",
            "--hardware",
            "gb300",
            "--layout",
            "wide-ep",
            "--ranks",
            "8",
            "--batches",
            "1,8,64",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    points = json.loads(res.output)["points"]
    assert [p["batch_per_rank"] for p in points] == [1, 8, 64]
    for p in points:
        assert p["tokens_per_s_per_user"] == pytest.approx(1000.0 / (p["tpot_s"] * 1e3))
        assert p["tokens_per_s_per_gpu"] == pytest.approx(p["batch_per_rank"] * 8 / p["tpot_s"] / 8)
    assert points[0]["tokens_per_s_per_user"] > points[-1]["tokens_per_s_per_user"]
    assert points[0]["tokens_per_s_per_gpu"] < points[-1]["tokens_per_s_per_gpu"]


def test_bad_layout_is_a_usage_error():
    res = runner.invoke(app, ["timing", "--layout", "dep4"])
    assert res.exit_code != 0 and "layout" in res.output
