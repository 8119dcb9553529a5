"""Run every row of a points file the way its mapping says (a simulated P/D deployment, or a phase
check) and compare with what was measured: rows, ratios, medians per hardware and framework."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

from rackserve.sim.run import run_policies
from rackserve.sim.scenario import scenario_from_dict
from rackserve.validate import phases
from rackserve.validate.mapping import (
    HARDWARE,
    LENGTH_SPREAD,
    MAX_REQUESTS,
    PROMPTS_PER_LANE,
    Mapped,
    map_point,
    read_layouts,
)
from rackserve.validate.points import DEFAULT_POINTS, Point, read_points

SCHEMA = "rackserve.validate/1"
FIGURES = ("tput_per_gpu", "tps_user", "ttft_s")


def scenario_of(m: Mapped) -> dict:
    """The simulator scenario of a `serving` or `aggregated` row: its workers (an aggregated row's engine
    settings, mapping.engine_settings), the benchmark's closed loop of random
    prompts (lengths drawn in 80-100%, 10 prompts per lane, all of the run measured, as InferenceX)."""
    timing = {"hardware": m.hardware, "model": m.model, "target_block_tokens": 64,
              "optimizations": "baseline" if m.mtp else "baseline,-mtp"}
    if m.expert_precision:
        timing["expert_precision"] = m.expert_precision
    if m.attention_math:
        timing["attention_math"] = m.attention_math
    engine = dict(m.engine)
    if engine.get("drafts"):
        timing["speculative"] = {"drafts": engine.pop("drafts")}
    sim = {**engine, **({"decode_max_batch_seqs": m.decode_batch_cap} if m.decode_batch_cap else {})}
    if m.kind == "aggregated":
        deployment = {"aggregated": [m.decode.as_group()]}
    else:
        deployment = {"prefill": [m.prefill.as_group()], "decode": [m.decode.as_group()]}
    return {
        "name": m.id,
        "timing": timing,
        "deployment": deployment,
        "routing": {"policy": "least-uncached-work", "seed": 0},
        **({"sim": sim} if sim else {}),
        "workload": {"kind": "uniform", "seed": 0, "concurrency": m.concurrency,
                     "requests": min(m.concurrency * PROMPTS_PER_LANE, MAX_REQUESTS),
                     "prompt_tokens": m.isl, "output_tokens": m.osl, "length_spread": LENGTH_SPREAD},
    }


def twin_figures(m: Mapped, p: Point) -> phases.Figures:
    if m.kind in ("serving", "aggregated"):
        result = run_policies(scenario_from_dict(scenario_of(m), m.id), ["least-uncached-work"])[0]
        return phases.Figures(result.throughput_per_gpu, 1.0 / result.tpot_p50_s, result.ttft_p50_s,
                              {"completed": result.completed, "span_s": result.span_s,
                               "ttft_p90_s": result.ttft_p90_s, "prefill_util": result.prefill_util})
    if m.kind == "prefill-phase":
        return phases.prefill_phase(m)
    if m.kind == "decode-at-speed":
        return phases.decode_at_speed(m, p.tps_user)
    if m.kind == "decode-saturated":
        return phases.decode_saturated(m)
    assert m.kind == "single-stream"
    return phases.single_stream(m)


def validate_row(p: Point, m: Mapped) -> dict:
    row = {"id": p.id, "hardware": p.hardware, "framework": p.framework, "model": p.model,
           "precision": p.precision, "kind": m.kind, "scenario": m.describe(), "read_as": m.read_as,
           "approximations": list(m.approximations), "measured": {f: getattr(p, f) for f in FIGURES},
           "tput_figure": m.tput_figure, "source": p.url}
    if m.kind == "unexpressed":
        row.update(twin={f: None for f in FIGURES}, ratio={f: None for f in FIGURES}, cpu_s=0.0)
        return row
    start = time.process_time()
    fig = twin_figures(m, p)
    row["cpu_s"] = time.process_time() - start
    row["twin"] = {"tput_per_gpu": fig.tput_per_gpu, "tps_user": fig.tps_user, "ttft_s": fig.ttft_s}
    if m.kind == "decode-at-speed":
        row["twin"]["tps_user"] = None  # held at the measured speed: not a prediction
    if m.compare is not None:
        row["twin"] = {f: (v if f in m.compare else None) for f, v in row["twin"].items()}
    row["detail"] = fig.detail
    row["gpus"] = m.gpus
    if m.kind in ("serving", "aggregated"):
        row["scenario_yaml"] = scenario_of(m)
    row["ratio"] = {f: _ratio(row["twin"][f], row["measured"][f]) for f in FIGURES}
    return row


def _shown(path: Path) -> str:
    """A path as a reader of the results can follow it: relative to the project where it is inside."""
    root = Path(__file__).resolve().parents[2]
    path = path.resolve()
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def _ratio(twin: float | None, measured: float | None) -> float | None:
    if twin is None or measured is None:
        return None
    return twin / measured


def median_abs_error(rows: list[dict]) -> dict:
    """Per figure: median over rows of |twin / measured - 1| (rows with both), and the row count."""
    out = {}
    for f in FIGURES:
        errs = [abs(r["ratio"][f] - 1.0) for r in rows if r["ratio"].get(f) is not None]
        out[f] = statistics.median(errs) if errs else None
        out[f"{f}_rows"] = len(errs)
    return out


def _median_ratio(rows: list[dict], f: str) -> float | None:
    vals = [r["ratio"][f] for r in rows if r["ratio"].get(f) is not None]
    return statistics.median(vals) if vals else None


def grouped(rows: list[dict], key: str) -> dict:
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(_group_name(r[key], key), []).append(r)
    return {name: {**median_abs_error(rs), **{f"{f}_median_ratio": _median_ratio(rs, f) for f in FIGURES},
                   "rows": [r["id"] for r in rs]} for name, rs in sorted(groups.items())}


def _group_name(value: str, key: str) -> str:
    if key == "hardware":
        return next((label for label, _ in HARDWARE if label in value), value)
    return value


def validate(points: str | Path = DEFAULT_POINTS, layouts: str | Path | None = None,
             progress: Callable[[str], None] | None = None, batch_caps: bool = True) -> dict:
    """validation.json's document for every row of `points` (SCHEMA)."""
    start = time.process_time()
    rows_in = read_points(points)
    readings = read_layouts() if layouts is None else read_layouts(layouts)
    rows = []
    for p in rows_in:
        if progress:
            progress(p.id)
        rows.append(validate_row(p, map_point(p, readings, batch_caps)))
    expressed = [r for r in rows if r["kind"] != "unexpressed"]
    return {
        "schema": SCHEMA,
        "points": _shown(Path(points)),
        "batch_caps": batch_caps,
        "rows": rows,
        "median_abs_error": median_abs_error(expressed),
        "median_ratio": {f: _median_ratio(expressed, f) for f in FIGURES},
        "by_hardware": grouped(expressed, "hardware"),
        "by_framework": grouped(expressed, "framework"),
        "by_kind": grouped(expressed, "kind"),
        "unexpressed": [{"id": r["id"], "why": r["approximations"]} for r in rows if r["kind"] == "unexpressed"],
        "cpu_s": time.process_time() - start,
    }
