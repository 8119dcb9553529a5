"""Sweeps: (scenario x concurrency x policy) runs fanned out as Ray tasks, concurrency refined by
itself (sim/frontier.py), and per scenario and policy the InferenceX curve: points, Pareto frontier
of throughput/GPU against tok/s/user (P50 and P90), peak, and throughput at target interactivities.

Ray is imported only inside `RayRunner` (the sweep's process boundary); the runs themselves are the
pure simulator.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rackserve.sim.frontier import (
    first_grid,
    next_concurrencies,
    pareto,
    saturated_at,
    throughput_at,
)
from rackserve.sim.run import keep_steps, run_policies, shared_timing, with_concurrency
from rackserve.sim.scenario import load_scenario

RAY_ENV = {  # local, loopback-only, offline Ray (ENVIRONMENT.md)
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
}
POINT_KEYS = ("concurrency", "throughput_per_gpu", "user_tps_p50", "user_tps_p90", "tps_user_e2e_p50",
              "tps_user_e2e_p90", "tps_user_itl_p50", "tps_user_itl_p90", "ttft_p50_s", "ttft_p90_s",
              "hit_rate", "completed")


@dataclass(frozen=True)
class GridPoint:
    scenario: str  # path of the scenario file
    concurrency: int
    policy: str
    duration_s: float | None = None  # workload duration override
    measure_start_s: float | None = None  # trace workload: measured window start override


def run_point(point: GridPoint) -> dict:
    """One simulation of the grid (runs inside a Ray task); returns the result as a dict."""
    sc = with_concurrency(load_scenario(point.scenario), point.concurrency)
    update = {}
    if point.duration_s is not None:
        update["duration_s"] = point.duration_s
    if point.measure_start_s is not None and hasattr(sc.workload, "measure_start_s"):
        update["measure_start_s"] = point.measure_start_s
    if update:
        sc = sc.with_workload(sc.workload.model_copy(update=update))
    timing = shared_timing(sc)
    (res,) = run_policies(sc, [point.policy], timing=timing)
    keep_steps(sc, timing)  # for the other workers and later sweeps, where a step store is configured
    return {"concurrency": point.concurrency, "scenario_path": point.scenario, **res.to_dict()}


def grid(scenarios: Sequence[str], concurrencies: Sequence[int], policies: Sequence[str],
         duration_s: float | None = None, measure_start_s: float | None = None) -> list[GridPoint]:
    return [GridPoint(s, c, p, duration_s, measure_start_s)
            for s, c, p in itertools.product(scenarios, concurrencies, policies)]


Runner = Callable[[Sequence[GridPoint]], list[dict]]


class RayRunner:
    """A local Ray instance for the whole sweep; each call runs a batch of points as tasks."""

    def __init__(self, num_cpus: int = 2) -> None:
        for key, value in RAY_ENV.items():
            os.environ.setdefault(key, value)
        import ray  # the sweep's process boundary: the core simulator stays free of Ray

        self._ray = ray
        # address="local": always our own instance, never another process's cluster on this machine
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
        self._task = ray.remote(num_cpus=1)(run_point)

    def __call__(self, points: Sequence[GridPoint]) -> list[dict]:
        return self._ray.get([self._task.remote(p) for p in points])

    def close(self) -> None:
        self._ray.shutdown()


def run_grid(points: Sequence[GridPoint], num_cpus: int = 2) -> list[dict]:
    """Fan a fixed grid out over a local Ray instance (one task per point)."""
    runner = RayRunner(num_cpus)
    try:
        return runner(points)
    finally:
        runner.close()


def adaptive(scenarios: Sequence[str], policies: Sequence[str], run: Runner, low: int = 1, high: int = 20_000,
             rounds: int = 2, batch: int = 2, duration_s: float | None = None,
             measure_start_s: float | None = None) -> list[dict]:
    """Per (scenario, policy): concurrency low, 4*low, ... in batches of `batch` until throughput
    stops growing (or `high`), then `rounds` rounds of bisection where the curve bends."""
    keys = list(itertools.product(scenarios, policies))
    rows: dict[tuple[str, str], list[dict]] = {k: [] for k in keys}
    todo = {k: first_grid(low, high) for k in keys}
    while any(todo.values()):  # climb: a few points per curve per batch, stop at saturation
        points = [GridPoint(s, c, p, duration_s, measure_start_s) for (s, p), cs in todo.items() for c in cs[:batch]]
        for k in keys:
            todo[k] = todo[k][batch:]
        for row in run(points):
            rows[(row["scenario_path"], row["policy"])].append(row)
        for k in keys:
            if saturated_at(rows[k]) is not None:
                todo[k] = []
    for _ in range(rounds):  # bisect where the curve bends
        points = [GridPoint(s, c, p, duration_s, measure_start_s) for (s, p) in keys
                  for c in next_concurrencies(rows[(s, p)])]
        if not points:
            break
        for row in run(points):
            rows[(row["scenario_path"], row["policy"])].append(row)
    return [r for k in keys for r in sorted(rows[k], key=lambda r: r["concurrency"])]


def _as_point(row: dict, interactivity: str) -> dict:
    """A run row as a curve point whose user_tps_p50 / user_tps_p90 are the chosen interactivity
    (AgentX E2E-normalized by default; rows that predate it keep their ITL-based figures)."""
    point = {k: row[k] for k in POINT_KEYS if k in row}
    for pc in ("p50", "p90"):
        value = row.get(f"tps_user_{interactivity}_{pc}")
        if value is not None:
            point[f"user_tps_{pc}"] = value
    return point


def curves(rows: Sequence[dict], targets: Sequence[float] = (), interactivity: str = "e2e") -> list[dict]:
    """Per (scenario, policy): points by concurrency, the P50 and P90 Pareto frontiers, the peak
    point and throughput/GPU at each target tok/s/user on both frontiers (None where it is not
    reached). `interactivity`: "e2e" (AgentX: output tokens / E2E latency) or "itl" (1 / TPOT)."""
    out = []
    for scenario, policy in sorted({(r["scenario"], r["policy"]) for r in rows}):
        pts = sorted((r for r in rows if (r["scenario"], r["policy"]) == (scenario, policy)),
                     key=lambda r: r["concurrency"])
        series = [_as_point(r, interactivity) for r in pts]
        f50, f90 = pareto(series, "user_tps_p50"), pareto(series, "user_tps_p90")
        peak = max(series, key=lambda p: p["throughput_per_gpu"])
        at = {f"{t:g}": {"p50": throughput_at(f50, t, "user_tps_p50"), "p90": throughput_at(f90, t, "user_tps_p90")}
              for t in targets}
        out.append({"scenario": scenario, "policy": policy, "interactivity": interactivity, "points": series,
                    "frontier_p50": f50, "frontier_p90": f90, "peak": peak, "at_target": at})
    return out


def ratios(curve_rows: Sequence[dict], targets: Sequence[float], base_scenario: str | None = None) -> list[dict]:
    """Throughput/GPU at each target relative to the base scenario's (default: the first), per policy
    (P90 frontier: AgentX reads the slow tail)."""
    out = []
    for policy in sorted({c["policy"] for c in curve_rows}):
        mine = [c for c in curve_rows if c["policy"] == policy]
        base = next((c for c in mine if c["scenario"] == base_scenario), mine[0])
        for c in mine:
            if c is base:
                continue
            for t in targets:
                a, b = base["at_target"][f"{t:g}"]["p90"], c["at_target"][f"{t:g}"]["p90"]
                out.append({"policy": policy, "target_tps_user": t, "base": base["scenario"], "other": c["scenario"],
                            "ratio": (b / a) if a and b is not None else None})
    return out
