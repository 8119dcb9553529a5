"""Fit the system-level parameters the public points expose, once across rows (not per point).

What is fitted is the decode step at the batch each measured deployment ran: an InferenceX row gives
output tok/s per decode GPU (notes) and 1 / median TPOT, so Little's law gives the sequences each
decode rank held, b = output tok/s per rank / tok/s per user, at a context of the mean prompt plus half
the mean output. The twin prices that step; the parameters are physical and the same on every
hardware:
  ep_straggler_s   each EP barrier (dispatch, combine) waits for the slowest of ep ranks: a rank's
                   arrival jitter, charged x sqrt(2 ln ep) (moe_cost._dispatch_combine);
  step_overhead_s  the engine's per-step host work the GPUs wait on (attention_cost.host_overhead);
  acceptance_length  tokens an MTP step keeps on the benchmark's random-token prompts (DeepSeek-V3's
                   MTP module, 3 drafts), which no source states for these runs.
Least squares on log(twin / measured) per-token time, one parameter at a time over its grid (coordinate
descent, three rounds), then a finer grid around the best.
Aggregated rows are left out (their steps carry prefill chunks); rows without the notes figure too.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from rackserve.timing.spec import load_model
from rackserve.timing.speculative import expected_accepted
from rackserve.validate import phases
from rackserve.validate.mapping import Mapped, decode_batch_implied, map_point, read_layouts
from rackserve.validate.points import DEFAULT_POINTS, read_points

PARAMS = ("ep_straggler_s", "step_overhead_s", "acceptance_length")
HARDWARE_PARAMS = ("ep_straggler_s", "step_overhead_s")
GRID = {"ep_straggler_s": np.linspace(0.0, 60e-6, 25), "step_overhead_s": np.linspace(0.0, 6e-3, 25),
        "acceptance_length": np.linspace(1.5, 3.5, 21)}
START = {"ep_straggler_s": 0.0, "step_overhead_s": 0.0}  # before the fit: no such terms


@dataclass(frozen=True)
class DecodeStep:
    """One measured decode step: the row, its batch per rank and context, the measured token time."""

    id: str
    mapped: Mapped
    batch_per_rank: int
    context: float
    measured_s: float


def decode_steps(points=DEFAULT_POINTS) -> list[DecodeStep]:
    readings = read_layouts()
    steps = []
    for p in read_points(points):
        m = map_point(p, readings)
        b = decode_batch_implied(p, m.decode)
        if b is None or m.kind != "serving" or not p.isl or not p.osl:
            continue
        context = phases.mean_length(p.isl) + phases.mean_length(p.osl) / 2.0
        steps.append(DecodeStep(p.id, m, b, context, 1.0 / p.tps_user))
    return steps


def twin_token_s(step: DecodeStep, values: dict) -> float:
    tm = phases.timing_model(step.mapped, values.get("acceptance_length"), {k: values[k] for k in HARDWARE_PARAMS})
    lay = phases.layout_of(tm, step.mapped.decode)
    return phases.token_time(tm, lay, step.batch_per_rank, step.context)


def log_errors(steps: list[DecodeStep], values: dict[str, float]) -> np.ndarray:
    return np.array([math.log(twin_token_s(s, values) / s.measured_s) for s in steps])


def fit(points=DEFAULT_POINTS, leave_one_out: bool = True) -> dict:
    """The fitted values, their residuals per row before and after (and, `leave_one_out`, each row's
    residual from a fit without it), and the fit's own record."""
    steps = decode_steps(points)
    doc = _fit_steps(steps)
    if leave_one_out:
        for i, row in enumerate(doc["rows"]):
            rest = _fit_steps(steps[:i] + steps[i + 1:])["params"]
            row["twin_token_ms_left_out"] = twin_token_s(steps[i], rest) * 1e3
            row["params_left_out"] = rest
        errs = [abs(r["twin_token_ms_left_out"] / r["measured_token_ms"] - 1.0) for r in doc["rows"]]
        doc["loo_median_abs_error"] = float(np.median(errs))
    return doc


def _fit_steps(steps: list[DecodeStep]) -> dict:
    rates = load_model("deepseek-v3").mtp.acceptance  # before the fit: the length its rates give (3.16)
    before = {**START, "acceptance_length": expected_accepted(rates)}
    best = dict(before)

    def cost(values: dict) -> float:
        return float(np.sum(log_errors(steps, values) ** 2))

    for grids in (GRID, None):
        for _ in range(3):
            for name in PARAMS:
                grid = grids[name] if grids else _finer(GRID[name], best[name])
                best = min(({**best, name: float(v)} for v in grid), key=cost)
    e0, e1 = log_errors(steps, before), log_errors(steps, best)
    rows = [{"id": s.id, "hardware": s.mapped.hardware, "decode": s.mapped.decode.describe(),
             "batch_per_rank": s.batch_per_rank, "context_tokens": round(s.context),
             "measured_token_ms": s.measured_s * 1e3,
             "twin_token_ms_before": s.measured_s * math.exp(a) * 1e3,
             "twin_token_ms_after": s.measured_s * math.exp(b) * 1e3}
            for s, a, b in zip(steps, e0, e1, strict=True)]
    return {
        "schema": "rackserve.validate.fit/1",
        "method": __doc__.strip().splitlines()[0],
        "params": best,
        "cost_before": cost(before),
        "cost_after": cost(best),
        "rows": rows,
        "rms_log_error_before": float(np.sqrt(np.mean(e0 ** 2))),
        "rms_log_error_after": float(np.sqrt(np.mean(e1 ** 2))),
        "median_abs_error_before": float(np.median(np.abs(np.exp(e0) - 1.0))),
        "median_abs_error_after": float(np.median(np.abs(np.exp(e1) - 1.0))),
    }


def _finer(grid: np.ndarray, at: float) -> np.ndarray:
    step = float(grid[1] - grid[0])
    return np.clip(np.linspace(at - step, at + step, 9), float(grid[0]), None)


FITTED = "FITTED: rackserve validate --fit (bench/results/validate_fit.json), once across the public points' decode steps"


def write_params(params: dict, spec_dir=None) -> list[str]:
    """Write the fitted values into every hardware file and DeepSeek-V3's MTP section (a line replaced, or
    added before `launch:`), each with its FITTED comment; returns the files changed."""
    from pathlib import Path

    from rackserve.timing import spec as spec_mod

    root = Path(spec_dir) if spec_dir else spec_mod.SPEC_DIR
    changed = []
    for path in sorted((root / "hardware").glob("*.yaml")):
        text = path.read_text()
        for name in HARDWARE_PARAMS:
            text = _set_line(text, name, params[name], "launch:")
        path.write_text(text)
        changed.append(str(path))
    v3 = root / "model" / "deepseek-v3.yaml"
    if v3.is_file() and params.get("acceptance_length"):
        v3.write_text(_set_line(v3.read_text(), "  acceptance_length", round(params["acceptance_length"], 3), None))
        changed.append(str(v3))
    spec_mod.load_hardware.cache_clear()
    spec_mod.load_model.cache_clear()
    return changed


def _set_line(text: str, key: str, value: float, before: str | None) -> str:
    line = f"{key}: {value:.6g}  # {FITTED}"
    pattern = re.compile(rf"^{re.escape(key)}:.*$", re.M)
    if pattern.search(text):
        return pattern.sub(lambda _: line, text, count=1)
    if before and re.search(rf"^{re.escape(before)}", text, re.M):
        return re.sub(rf"^{re.escape(before)}", lambda m: line + "\n" + m.group(0), text, count=1, flags=re.M)
    return text.rstrip("\n") + "\n" + line + "\n"
