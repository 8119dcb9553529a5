"""rackserve/validate/fit.py: the fit finds parameters it is given back, and writes them where the
model reads them."""

from __future__ import annotations

import json
import math

import pytest

from rackserve.validate import fit as fit_mod
from rackserve.validate.points import DEFAULT_POINTS


def test_the_fit_recovers_known_parameters_from_synthetic_measurements(tmp_path, monkeypatch):
    """Rows whose 'measured' token times are the twin's own at known parameters: the fit must find them."""
    truth = {"ep_straggler_s": 15e-6, "step_overhead_s": 1.5e-3, "acceptance_length": 2.5}
    steps = fit_mod.decode_steps(DEFAULT_POINTS)
    assert len(steps) >= 8 and any(s.mapped.mtp for s in steps)
    lines = []
    by_id = {s.id: s for s in steps}
    for line in DEFAULT_POINTS.read_text().splitlines():
        row = json.loads(line)
        if row["id"] in by_id:
            row["tps_user"] = 1.0 / fit_mod.twin_token_s(by_id[row["id"]], truth)
            # keep the batch per rank the notes imply: out/GPU = b x tps / GPUs per rank
            s = by_id[row["id"]]
            out = s.batch_per_rank * row["tps_user"] / s.mapped.decode.gpus_per_rank
            row["notes"] = f"output tok/s per decode GPU={out:.6f}"
        lines.append(json.dumps(row))
    synthetic = tmp_path / "points.jsonl"
    synthetic.write_text("\n".join(lines) + "\n")
    got = fit_mod.fit(synthetic, leave_one_out=False)
    for name, value in truth.items():
        assert got["params"][name] == pytest.approx(value, rel=0.05), name
    assert got["rms_log_error_after"] < 0.01 < got["rms_log_error_before"]


def test_written_parameters_are_what_the_model_loads(tmp_path):
    from shutil import copytree

    from rackserve.timing import spec as spec_mod

    copytree(spec_mod.SPEC_DIR, tmp_path / "specs")
    params = {"ep_straggler_s": 1.25e-5, "step_overhead_s": 7.5e-4, "acceptance_length": 2.345}
    changed = fit_mod.write_params(params, tmp_path / "specs")
    assert any(p.endswith("deepseek-v3.yaml") for p in changed) and len(changed) >= 8
    for path in (tmp_path / "specs/hardware").glob("*.yaml"):
        hw = spec_mod.parse_hardware(__import__("yaml").safe_load(path.read_text()), str(path))
        assert math.isclose(hw.ep_straggler_s, 1.25e-5) and math.isclose(hw.step_overhead_s, 7.5e-4)
        assert "FITTED" in path.read_text()
    v3 = spec_mod.parse_model(__import__("yaml").safe_load((tmp_path / "specs/model/deepseek-v3.yaml").read_text()))
    assert v3.mtp.acceptance_length == pytest.approx(2.345)
    again = fit_mod.write_params(params, tmp_path / "specs")  # replaced, not added twice
    assert again == changed
    assert (tmp_path / "specs/hardware/h200.yaml").read_text().count("ep_straggler_s:") == 1
