"""The sweep's one plot: every scenario's and policy's Pareto frontier of throughput/GPU against
tok/s/user (P50 solid, P90 dashed), its peak, and the target interactivities (matplotlib Agg)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rackserve.sim.report import save_figure  # noqa: E402


def plot_frontiers(curve_rows: Sequence[dict], path: Path, targets: Sequence[float] = (),
                   extra_runs: Sequence[dict] = (), extra_label: str = "") -> None:
    """The frontiers; `extra_runs` (run rows, e.g. the same points over a longer window) are drawn as
    hollow markers in their scenario's colour and policy's marker."""
    fig, ax = plt.subplots(figsize=(9, 5.5))
    scenarios = sorted({c["scenario"] for c in curve_rows})
    policies = sorted({c["policy"] for c in curve_rows})
    colors = plt.get_cmap("tab10")
    for c in curve_rows:  # colour = scenario, marker = policy
        f50, f90 = c["frontier_p50"], c["frontier_p90"]
        color = colors(scenarios.index(c["scenario"]) % 10)
        marker = "osD^v<>"[policies.index(c["policy"]) % 7]
        label = f"{c['scenario']} {c['policy']}" + (f" ({c['window_s']:g} s)" if "window_s" in c else "")
        ax.plot([p["user_tps_p50"] for p in f50], [p["throughput_per_gpu"] for p in f50], marker=marker,
                color=color, label=f"{label} P50")
        ax.plot([p["user_tps_p90"] for p in f90], [p["throughput_per_gpu"] for p in f90], marker=marker,
                markersize=3, linestyle="--", color=color, alpha=0.5)
        pk = c["peak"]
        ax.scatter([pk["user_tps_p50"]], [pk["throughput_per_gpu"]], marker="*", s=160, color=color, zorder=5)
    for r in extra_runs:
        color = colors(scenarios.index(r["scenario"]) % 10) if r["scenario"] in scenarios else "black"
        marker = "osD^v<>"[policies.index(r["policy"]) % 7] if r["policy"] in policies else "x"
        ax.scatter([r["user_tps_p50"]], [r["throughput_per_gpu"]], marker=marker, s=70, facecolors="none",
                   edgecolors=color, linewidths=1.5, zorder=6)
    if extra_runs and extra_label:
        ax.scatter([], [], marker="o", s=70, facecolors="none", edgecolors="black", label=extra_label)
    for t in targets:
        ax.axvline(t, color="grey", linestyle=":", linewidth=1)
        ax.annotate(f"{t:g} tok/s/user", (t, ax.get_ylim()[1]), fontsize=7, rotation=90, va="top", ha="right")
    kind = curve_rows[0].get("interactivity", "itl") if curve_rows else "itl"
    ax.set_xlabel("interactivity: output tok/s per user, " + ("E2E-normalized (TTFT counts)" if kind == "e2e"
                                                             else "ITL-based (1000 / TPOT ms)"))
    ax.set_ylabel("throughput per GPU ((input + output) tok/s)")
    ax.set_title("Pareto frontiers: P50 solid, P90 dashed (stars: peak throughput)")
    save_figure(fig, ax, path, fontsize=6)


def plot_by_lanes(runs: Sequence[dict], path: Path, extra_runs: Sequence[dict] = (), extra_label: str = "") -> None:
    """Throughput/GPU against lanes (log scale), one panel per scenario and one line per policy, every
    point of the curve including those past its peak (which the frontiers leave out); `extra_runs`
    hollow, as in plot_frontiers."""
    scenarios = sorted({r["scenario"] for r in runs})
    policies = sorted({r["policy"] for r in runs})
    cols = min(2, len(scenarios))
    rows = -(-len(scenarios) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 3.8 * rows), squeeze=False)
    colors = plt.get_cmap("tab10")
    for ax, scenario in zip(axes.flat, scenarios, strict=False):
        for i, policy in enumerate(policies):
            pts = sorted((r for r in runs if (r["scenario"], r["policy"]) == (scenario, policy)),
                         key=lambda r: r["concurrency"])
            if not pts:
                continue
            ax.plot([r["concurrency"] for r in pts], [r["throughput_per_gpu"] for r in pts],
                    marker="osD^v<>"[i % 7], color=colors(i % 10), label=policy)
            pk = max(pts, key=lambda r: r["throughput_per_gpu"])
            ax.scatter([pk["concurrency"]], [pk["throughput_per_gpu"]], marker="*", s=140, color=colors(i % 10),
                       zorder=5)
        for r in extra_runs:
            if r["scenario"] == scenario and r["policy"] in policies:
                i = policies.index(r["policy"])
                ax.scatter([r["concurrency"]], [r["throughput_per_gpu"]], marker="osD^v<>"[i % 7], s=70,
                           facecolors="none", edgecolors=colors(i % 10), linewidths=1.5, zorder=6)
        ax.set_xscale("log")
        ax.set_title(scenario, fontsize=9)
        ax.set_xlabel("lanes (concurrent conversations)")
        ax.set_ylabel("(input + output) tok/s per GPU")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(scenarios):]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if extra_runs and extra_label:
        handles.append(axes.flat[0].scatter([], [], marker="o", s=70, facecolors="none", edgecolors="black"))
        labels.append(extra_label)
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=len(labels))
    fig.suptitle("Throughput per GPU by lanes, every point (stars: peak)", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)
