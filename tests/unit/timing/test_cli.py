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
    enabled = json.loads(one.output)["optimizations"]
    assert enabled == ["domain-local", "fp8xfp4-k64", "mtp", "two-batch-overlap"]
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


def test_decode_shows_mtp_draft_verify_and_accepted_length():
    res = runner.invoke(app, ["timing", "--layout", "tp8", "--phase", "decode", "--batch", "1"])
    assert res.exit_code == 0, res.output
    # 2.49: the AgentX golden acceptance length pinned since issue 31 (3.645 from the rates before)
    assert "mtp_draft" in res.output and "expected accepted 2.490 tokens/step" in res.output
    assert "verify 5 positions" in res.output and "tok/s/user" in res.output
    on = json.loads(runner.invoke(app, ["timing", "--layout", "tp8", "--phase", "decode",
                                        "--batch", "1", "--json"]).output)  # fmt: skip
    off = json.loads(runner.invoke(app, ["timing", "--layout", "tp8", "--phase", "decode",
                                         "--batch", "1", "--opt", "rubin-optimized,-mtp",
                                         "--json"]).output)  # fmt: skip
    assert on["tpot_s"] == pytest.approx(on["total_s"] / on["accepted_tokens"])
    assert off["accepted_tokens"] == 1.0 and off["draft_s"] == 0.0
    # 1.8, not 2: 2.49 accepted tokens per step since issue 31 (3.645 before)
    assert on["tokens_per_s_per_user"] > 1.8 * off["tokens_per_s_per_user"]


def test_skipped_switches_are_listed_with_why():
    res = runner.invoke(app, ["timing", "--hardware", "gb300"])
    assert res.exit_code == 0
    assert "skipped switch fp8xfp4-k64: gb300 lacks sm107_mma" in res.output
    vr = runner.invoke(app, ["timing", "--hardware", "vr200"])
    assert "skipped switch" not in vr.output


def test_explain_gives_each_switch_its_saving():
    res = runner.invoke(app, ["timing", "--layout", "tp8", "--phase", "decode", "--batch", "1",
                              "--explain", "--json"])  # fmt: skip
    savings = {s["switch"]: s for s in json.loads(res.output)["switch_savings"]}
    assert set(savings) == set(json.loads(res.output)["optimizations"])
    assert savings["pdl"]["step_saving_s"] > 0 and savings["mtp"]["per_token_saving_s"] > 0
    assert savings["two-batch-overlap"]["step_saving_s"] == 0.0  # no EP in tp8
    table = runner.invoke(app, ["timing", "--layout", "tp8", "--phase", "decode", "--explain"])
    assert "switch off" in table.output and "fused-ar-mhc" in table.output


def test_curve_over_contexts_decode_feels_context():
    res = runner.invoke(app, ["timing", "curve", "--layout", "wide-ep", "--context",
                              "8k,32k,128k,256k", "--batches", "64", "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    points = json.loads(res.output)["points"]
    assert [p["context"] for p in points] == [8192, 32768, 131072, 262144]
    steps = [p["step_s"] for p in points]
    assert all(a < b for a, b in zip(steps, steps[1:], strict=False))
    bad = runner.invoke(app, ["timing", "curve", "--context", "8q"])
    assert bad.exit_code != 0 and "context" in bad.output


def test_decode_explain_shows_acceptance_draft_and_verify_parts():
    """Issue 31: `rackserve timing --layout tp8 --phase decode --batch 1 --explain` shows the
    acceptance (pinned 2.49, per-position rates), the verify part and the draft passes;
    --acceptance-length replaces the pinned value."""
    args = ["timing", "--layout", "tp8", "--phase", "decode", "--batch", "1", "--explain"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "MTP acceptance: 2.490 tokens/step" in res.output
    assert "verify 5 positions" in res.output and "4 passes one after another" in res.output
    out = json.loads(runner.invoke(app, [*args, "--json", "--acceptance-length", "3"]).output)
    assert out["accepted_tokens"] == pytest.approx(3.0) and out["draft_passes"] == 4
    assert len(out["acceptance_rates"]) == 4
