"""The rack's frontier, searched: screen every configuration of a rack's space analytically, confirm
the screen's envelope by replay, and report the envelope as AgentX reads it (frontier.json).

    rack + space  ->  screen (screen.py, every configuration)  ->  plan (plan.py)
                  ->  replay (confirm.py, Ray tasks)  ->  envelope, winners, peak, area, screen error
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from rackserve.search import envelope as env_math
from rackserve.search.confirm import Runner
from rackserve.search.mix import Mix, mix_of
from rackserve.search.plan import (
    CPU_S_PER_POINT,
    CPU_S_PER_REQUEST,
    Candidate,
    plan,
    refine,
    within_budget,
)
from rackserve.search.rack import RackSpec, configurations, scenario_of
from rackserve.search.screen import TimingCache, screen_config

SCHEMA = "rackserve.sim.frontier/1"
INTERACTIVITY = ("e2e", "itl")
PERCENTILES = ("p50", "p90")
Curves = dict[str, tuple[dict, list[dict]]]
# plan's candidates run after the targets are pinned down (refine): runners-up, the rest of the envelope
LATER = ("runner-up", "below the peak", "on the screen's envelope")
REFINE_ROUNDS = 8  # rounds of refine() (each a replay per target and configuration still open)


def speed_key(interactivity: str, percentile: str) -> str:
    if interactivity not in INTERACTIVITY:
        raise ValueError(f"interactivity: one of {INTERACTIVITY}, got {interactivity!r}")
    if percentile not in PERCENTILES:
        raise ValueError(f"percentile: one of {PERCENTILES}, got {percentile!r}")
    return f"tps_user_{interactivity}_{percentile}"


def with_trace(rack: RackSpec, trace: str | None) -> RackSpec:
    """The rack with another conversation file in place of its workload's trace (every other
    workload field kept)."""
    if not trace:
        return rack
    return rack.model_copy(update={"workload": {**rack.workload, "trace": str(trace)}})


def rack_mix(rack: RackSpec) -> Mix:
    configs = configurations(rack)
    if not configs:
        raise ValueError(f"{rack.name}: no configuration of the space fits {rack.gpus} GPUs")
    sc = scenario_of(rack, configs[0])
    workload = sc.workload
    if getattr(workload, "kind", "") != "agentx-trace":
        raise ValueError("workload.kind: the frontier search replays agentx-trace workloads")
    return mix_of(workload, sc.config.timing.target_block_tokens * sc.sim.kv_block_multiple)


def screen_all(rack: RackSpec, mix: Mix) -> tuple[Curves, list[dict]]:
    """Every configuration's predicted curve (label -> (config, points)); the ones that do not fit,
    with why."""
    cache = TimingCache()
    curves: Curves = {}
    rejected = []
    for cfg in configurations(rack):
        try:
            curve = screen_config(rack, cfg, mix, cache)
        except ValueError as exc:
            rejected.append({"config": cfg.label, "why": str(exc)})
            continue
        d = {**cfg.to_dict(), "screen_bound": curve.bound, "screen_note": curve.note}
        curves[cfg.label] = (d, curve.points)
    return curves, rejected


def _labelled(point: dict, x_kind: str) -> dict:
    out = dict(point)
    out["tps_user_p50"] = point.get(f"tps_user_{x_kind}_p50")
    out["tps_user_p90"] = point.get(f"tps_user_{x_kind}_p90")
    return out


def _interp(curve: Sequence[dict], lanes: int, key: str) -> float:
    pts = sorted(curve, key=lambda p: p["concurrency"])
    xs = np.array([p["concurrency"] for p in pts], dtype=float)
    ys = np.array([p[key] for p in pts], dtype=float)
    return float(np.interp(lanes, xs, ys))


def screen_error(curves: Curves, replays: Sequence[dict], x: str) -> dict:
    """The screen's prediction at every replayed (configuration, lanes) against the replay."""
    rows = []
    for r in replays:
        label = r["config"]["label"]
        if label not in curves or not r.get("completed"):
            continue
        curve = curves[label][1]
        row = {"config": label, "concurrency": r["concurrency"]}
        for key in ("throughput_per_gpu", x):
            pred, real = _interp(curve, r["concurrency"], key), r.get(key)
            row[key] = {"screen": pred, "replay": real,
                        "rel_err": (pred - real) / real if real and math.isfinite(real) else None}
        rows.append(row)

    def median(key: str) -> float | None:
        errs = [abs(r[key]["rel_err"]) for r in rows if r[key]["rel_err"] is not None]
        return statistics.median(errs) if errs else None

    return {"median_throughput": median("throughput_per_gpu"), f"median_{x}": median(x),
            "median_tps_user": median(x), "per_point": rows}


def report(rack: RackSpec, curves: Curves, rejected: list[dict], replays: Sequence[dict], mix: Mix,
           interactivity: str, percentile: str, targets: Sequence[float], cpu_s: dict, extra: dict) -> dict:
    """frontier.json: every point, the envelopes (from replays; from the screen only when nothing was
    replayed, and then marked so), per target the winner or null, the peak, the area, the screen's error."""
    x = speed_key(interactivity, percentile)
    screen_pts = [_labelled({**p, "config": cfg, "source": "screen"}, interactivity)
                  for cfg, curve in curves.values() for p in curve]
    # AgentX drops an invalid run (>1% context overflow, <95% metric coverage) from the frontier
    replay_pts = [_labelled(r, interactivity) for r in replays if r.get("completed") and r.get("valid") is not False]
    invalid = [_labelled(r, interactivity) for r in replays if r.get("completed") and r.get("valid") is False]
    basis = replay_pts or screen_pts
    envs = {pc: env_math.envelope(basis, "tps_user_" + pc) for pc in PERCENTILES}
    env = envs[percentile]
    screen_envs = {pc: env_math.envelope(screen_pts, "tps_user_" + pc) for pc in PERCENTILES}
    screen_env = screen_envs[percentile]
    at = {f"{t:g}": _at_target(env, screen_env, t, "tps_user_" + percentile, bool(replay_pts)) for t in targets}
    peak = max(basis, key=lambda p: p["throughput_per_gpu"], default=None)
    lo, hi = (min(targets), max(targets)) if targets else (0.0, 0.0)
    return {
        "schema": SCHEMA, "rack": rack.name, "hardware": rack.timing.get("hardware"), "gpus": rack.gpus,
        "interactivity": interactivity, "percentile": percentile, "targets": list(targets),
        "envelope_source": "replay" if replay_pts else "screen",
        # screened points of the configurations that matter (on a screen envelope, replayed or planned):
        # every configuration's full curve would be ~45 MB; each is summarised under "configs"
        "points": replay_pts + _kept(screen_pts, replay_pts, screen_envs, extra),
        "invalid_points": invalid,
        "configs": [_summary(cfg, curve, x) for cfg, curve in curves.values()],
        "envelope": {pc: [_brief(p) for p in e] for pc, e in envs.items()},
        "screen_envelope": {pc: [_brief(p) for p in e] for pc, e in screen_envs.items()},
        "at_target": at, "peak": _brief(peak) if peak else None,
        "area": env_math.area(env, lo, hi, "tps_user_" + percentile), "area_range": [lo, hi],
        "screen_error": screen_error(curves, replay_pts, x),
        "configs_screened": len(curves), "configs_rejected": rejected, "mix": mix.summary(),
        "cpu_s": cpu_s, **extra,
    }


def _kept(screen_pts: list[dict], replay_pts: list[dict], screen_envs: dict[str, list[dict]],
          extra: dict) -> list[dict]:
    keep = {p["config"]["label"] for p in replay_pts}
    keep |= {c["config"]["label"] for c in extra.get("planned", [])}
    for e in screen_envs.values():
        keep |= {p["config"]["label"] for p in e}
    return [p for p in screen_pts if p["config"]["label"] in keep]


def _summary(cfg: dict, curve: Sequence[dict], x: str) -> dict:
    """One screened configuration in a line: what bounds it, its predicted peak and best speed."""
    return {"label": cfg["label"], "gpus": cfg.get("gpus"), "bound": cfg.get("screen_bound"),
            "note": cfg.get("screen_note"),
            "peak_throughput_per_gpu": max((p["throughput_per_gpu"] for p in curve), default=None),
            f"best_{x}": max((p[x] for p in curve), default=None)}


def _at_target(env: list[dict], screen_env: list[dict], target: float, x: str, replayed: bool) -> dict | None:
    """The winner at `target` on the replayed envelope; the screen's where the replays do not reach
    down to the target and the screen says more throughput lies there (marked source "screen");
    None only when neither envelope reaches the target."""
    win, scr = env_math.winner_at(env, target, x), env_math.winner_at(screen_env, target, x)
    if win is None and scr is None:
        return None
    below = bool(env) and target < min(p[x] for p in env)
    unconfirmed = win is None or (below and scr is not None and scr["throughput_per_gpu"] > 1.1 * win["throughput_per_gpu"])
    use, source = (scr, "screen") if unconfirmed or not replayed else (win, "replay")
    return {"config": use["config"], "throughput_per_gpu": use["throughput_per_gpu"], "source": source,
            "point": _brief(use["point"]), "screen_config": scr and scr["config"],
            "screen_throughput_per_gpu": scr and scr["throughput_per_gpu"]}


def _brief(p: dict) -> dict:
    keys = ("concurrency", "window_s", "throughput_per_gpu", "tps_user_p50", "tps_user_p90", "tps_user_e2e_p50",
            "tps_user_e2e_p90", "tps_user_itl_p50", "tps_user_itl_p90", "ttft_p50_s", "ttft_p90_s", "source")
    return {"config": p["config"], **{k: p.get(k) for k in keys}}


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def search(rack: RackSpec, runner_factory: Callable[[], Runner] | None, interactivity: str = "e2e",
           percentile: str = "p90", targets: Sequence[float] | None = None, budget_cpu_s: float | None = None,
           previous: Sequence[dict] = (), on_update: Callable[[dict], None] | None = None,
           extra: dict | None = None, max_point_cpu_s: float | None = None) -> dict:
    """The whole search. `runner_factory` None: screen only. `previous`: replay points of an earlier
    run of the same rack and window (resumed, not run again). `on_update(report)` after every replay."""
    x = speed_key(interactivity, percentile)
    targets = list(targets if targets is not None else rack.search.targets)
    wall0 = time.perf_counter()
    t0 = time.process_time()
    mix = rack_mix(rack)
    curves, rejected = screen_all(rack, mix)
    screen_cpu = time.process_time() - t0
    replays = [r for r in previous if r.get("source") == "replay" and r["config"]["label"] in curves]
    resumed = len(replays)
    cands = plan(curves, targets, x, rack.search.window_s, _cpu_per_request(replays, rack.search.warmup_s),
                 max_point_cpu_s, warmup_s=rack.search.warmup_s)
    todo = within_budget(cands, budget_cpu_s, {(r["config"]["label"], r["concurrency"]) for r in replays})
    base = {"window_s": rack.search.window_s, "planned": [c.__dict__ for c in cands],
            "code": git_commit(), **(extra or {})}

    def build() -> dict:
        cpu = {"screen": screen_cpu, "replay": sum(r.get("cpu_s") or 0.0 for r in replays)}
        cpu["total"] = cpu["screen"] + cpu["replay"]
        # this invocation's wall time (a resumed search's earlier runs are not in it)
        return report(rack, curves, rejected, replays, mix, interactivity, percentile, targets, cpu,
                      {**base, "wall_s": time.perf_counter() - wall0, "resumed_replays": resumed})

    if runner_factory is not None:
        first = [c for c in todo if not c.why.startswith(LATER)]  # the targets' winners and brackets, the peak
        runner = runner_factory()

        def run(cands: Sequence[Candidate]) -> None:
            for row in runner.run(rack.model_dump(), cands):
                row["why"] = next((c.why for c in cands if c.key == (row["config"]["label"], row["concurrency"])), "")
                replays.append(row)
                if on_update:
                    on_update(build())

        def left() -> float | None:
            """The budget less the CPU this invocation's replays measured (not what was predicted:
            a prediction too dear would leave budget unspent, one too cheap would overrun it)."""
            spent = sum(r.get("cpu_s") or 0.0 for r in replays[resumed:])
            return None if budget_cpu_s is None else budget_cpu_s - spent

        try:
            run(first)
            for _ in range(REFINE_ROUNDS):  # pin each target down on the replayed curves
                cpr = _cpu_per_request(replays, rack.search.warmup_s)
                more = refine(curves, replays, targets, x, rack.search.window_s, cpr, max_point_cpu_s,
                              warmup_s=rack.search.warmup_s)
                more = within_budget(more, left(), set())
                if not more:
                    break
                base["planned"] += [c.__dict__ for c in more]
                run(more)
            # the rest in plan's order, windows and costs predicted from the CPU per request measured so far
            cpr = _cpu_per_request(replays, rack.search.warmup_s)
            rest = [c for c in plan(curves, targets, x, rack.search.window_s, cpr, max_point_cpu_s,
                                    warmup_s=rack.search.warmup_s) if c.why.startswith(LATER)]
            base["planned"] = [c for c in base["planned"] if not c["why"].startswith(LATER)]
            base["planned"] += [c.__dict__ for c in rest]
            run(within_budget(rest, left(), {(r["config"]["label"], r["concurrency"]) for r in replays}))
        finally:
            runner.close()
    return build()


def _cpu_per_request(replays: Sequence[dict], warmup_s: float) -> float:
    """CPU seconds per simulated request, from the points already run (else plan's measured figure)."""
    # arrivals count the window only; the warm-up's requests cost as much each
    rows = [(r["cpu_s"] - CPU_S_PER_POINT, r["arrivals"] * (r["window_s"] + warmup_s) / r["window_s"])
            for r in replays if r.get("arrivals") and r.get("cpu_s") and r.get("window_s")]
    if not rows:
        return CPU_S_PER_REQUEST
    return max(sum(c for c, _ in rows) / sum(n for _, n in rows), 1e-5)


def read_previous(path: Path, rack: str | None = None) -> list[dict]:
    """The replayed points of a frontier.json (none when it does not exist); ValueError when it is
    another rack's (`rack`: the name it must carry)."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    if rack is not None and data.get("rack") != rack:
        raise ValueError(f"{path}: replays of rack {data.get('rack')!r}, not {rack!r}")
    # invalid replays too: they were run (and cost as much), they only stay off the envelope
    return [p for p in data.get("points", []) + data.get("invalid_points", []) if p.get("source") == "replay"]


def merge_replays(*runs: Sequence[dict]) -> list[dict]:
    """Replayed points of several searches of one rack, each (configuration, lanes, window) once
    (the first run's copy kept)."""
    seen, out = set(), []
    for run in runs:
        for p in run:
            key = (p["config"]["label"], p["concurrency"], p.get("window_s"))
            if key not in seen:
                seen.add(key)
                out.append(p)
    return out
