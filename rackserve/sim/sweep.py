"""Sweeps: a grid of (deployment scenario x concurrency x policy) runs fanned out as Ray tasks, and
the throughput-per-GPU vs tok/s/user curve with its peak.

Ray is imported only inside `run_grid` (the sweep's process boundary); the runs themselves are the
pure simulator.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rackserve.sim.run import run_policies, with_concurrency  # noqa: E402
from rackserve.sim.scenario import load_scenario  # noqa: E402

RAY_ENV = {  # local, loopback-only, offline Ray (ENVIRONMENT.md)
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
}


@dataclass(frozen=True)
class GridPoint:
    scenario: str  # path of the scenario file
    concurrency: int
    policy: str
    duration_s: float | None = None


def run_point(point: GridPoint) -> dict:
    """One simulation of the grid (runs inside a Ray task); returns the result as a dict."""
    sc = with_concurrency(load_scenario(point.scenario), point.concurrency)
    if point.duration_s is not None:
        sc = sc.with_workload(sc.workload.model_copy(update={"duration_s": point.duration_s}))
    (res,) = run_policies(sc, [point.policy])
    return {"concurrency": point.concurrency, **res.to_dict()}


def grid(scenarios: Sequence[str], concurrencies: Sequence[int], policies: Sequence[str],
         duration_s: float | None = None) -> list[GridPoint]:
    return [GridPoint(s, c, p, duration_s) for s, c, p in itertools.product(scenarios, concurrencies, policies)]


def run_grid(points: Sequence[GridPoint], num_cpus: int = 2) -> list[dict]:
    """Fan the grid out over a local Ray instance (one task per point)."""
    for key, value in RAY_ENV.items():
        os.environ.setdefault(key, value)
    import ray  # the sweep's process boundary: the core simulator stays free of Ray

    # address="local": always our own instance, never another process's cluster on this machine
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1)(run_point)
        return ray.get([task.remote(p) for p in points])
    finally:
        ray.shutdown()


def curves(rows: Sequence[dict]) -> list[dict]:
    """Per (scenario, policy): points by concurrency and the peak-throughput point."""
    out = []
    keys = sorted({(r["scenario"], r["policy"]) for r in rows})
    for scenario, policy in keys:
        pts = sorted((r for r in rows if (r["scenario"], r["policy"]) == (scenario, policy)),
                     key=lambda r: r["concurrency"])
        series = [{"concurrency": r["concurrency"], "throughput_per_gpu": r["throughput_per_gpu"],
                   "user_tps_p50": r["user_tps_p50"], "user_tps_p90": r["user_tps_p90"]} for r in pts]
        peak = max(series, key=lambda p: p["throughput_per_gpu"])
        out.append({"scenario": scenario, "policy": policy, "points": series, "peak": peak})
    return out


def plot_curves(curve_rows: Sequence[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for c in curve_rows:
        xs50 = [p["user_tps_p50"] for p in c["points"]]
        xs90 = [p["user_tps_p90"] for p in c["points"]]
        ys = [p["throughput_per_gpu"] for p in c["points"]]
        (line,) = ax.plot(xs50, ys, marker="o", label=f"{c['scenario']} {c['policy']} P50")
        ax.plot(xs90, ys, marker=".", linestyle="--", color=line.get_color(), label=f"{c['scenario']} {c['policy']} P90")
        pk = c["peak"]
        ax.scatter([pk["user_tps_p50"]], [pk["throughput_per_gpu"]], marker="*", s=200, color=line.get_color(), zorder=5)
        ax.annotate(f"peak @ {pk['concurrency']}", (pk["user_tps_p50"], pk["throughput_per_gpu"]),
                    textcoords="offset points", xytext=(5, 5), fontsize=7)
    ax.set_xlabel("output tok/s per user")
    ax.set_ylabel("throughput per GPU (input + output tok/s)")
    ax.set_title("Throughput per GPU vs interactivity (labels: concurrency at peak)")
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
