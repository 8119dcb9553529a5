"""The planned run's timeline (SimResult.planner): load, instances per role, TTFT / ITL P90 per tick."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rackserve.sim.metrics import SimResult  # noqa: E402


def plot_planner_timeline(results: Sequence[SimResult], path: Path, labels: Sequence[str] | None = None) -> None:
    """Three panels over simulated time, one line per run: arrivals/s, active prefill (solid) and
    decode (dashed) instances, TTFT P90 (solid) and ITL P90 (dashed) against their targets (dotted)."""
    fig, axes = plt.subplots(3, 1, figsize=(7, 8), sharex=True)
    for i, r in enumerate(results):
        p = r.planner
        if not p:
            continue
        tl, label = p["timeline"], (labels[i] if labels else f"{r.policy} / {p['policy']}")
        (line,) = axes[0].plot(tl["t_s"], tl["arrivals_per_s"], label=label)
        c = line.get_color()
        axes[1].step(tl["t_s"], tl["prefill_active"], where="post", color=c, label=f"{label} prefill")
        axes[1].step(tl["t_s"], tl["decode_active"], where="post", color=c, linestyle="--", label=f"{label} decode")
        axes[2].plot(tl["t_s"], tl["ttft_p90_s"], color=c, label=f"{label} TTFT")
        axes[2].plot(tl["t_s"], tl["itl_p90_s"], color=c, linestyle="--", label=f"{label} ITL")
    first = next((r.planner for r in results if r.planner), None)
    if first is not None:
        axes[2].axhline(first["ttft_target_s"], linestyle=":", color="k", linewidth=1)
        axes[2].axhline(first["itl_target_s"], linestyle=":", color="grey", linewidth=1)
    axes[0].set_ylabel("arrivals / s")
    axes[1].set_ylabel("active instances")
    axes[2].set_ylabel("P90 per tick (s)")
    axes[2].set_yscale("log")
    axes[2].set_xlabel("simulated s")
    axes[0].set_title(f"planner: {results[0].scenario}")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
