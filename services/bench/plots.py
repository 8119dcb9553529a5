"""PNG plots of a benchmark result: TTFT CDF and the per-user output speed histogram."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def write_plots(result: dict, out_dir: str | Path) -> list[Path]:
    """Writes ttft_cdf.png and tok_per_s_per_user.png into out_dir; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    unit = "s" if result["clock"] == "simulated" else "wall s"
    paths = [out / "ttft_cdf.png", out / "tok_per_s_per_user.png"]

    fig, ax = plt.subplots(figsize=(6, 4))
    ttfts = np.sort(np.asarray(result["ttfts"], dtype=float))
    if ttfts.size:
        ax.step(ttfts, np.arange(1, ttfts.size + 1) / ttfts.size, where="post")
    ax.set(xlabel=f"TTFT ({unit})", ylabel="fraction of requests", title="TTFT CDF")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(paths[0], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    speeds = np.asarray(result["output_tok_per_s_per_user"], dtype=float)
    if speeds.size:
        ax.hist(speeds, bins=min(30, max(5, speeds.size // 3)))
        for q, style in ((50, "-"), (90, "--")):
            ax.axvline(
                np.percentile(speeds, 100 - q), color="k", linestyle=style, label=f"P{q} user"
            )
        ax.legend()
    ax.set(
        xlabel=f"output tokens/s per user (1/TPOT, per {unit})",
        ylabel="requests",
        title="Per-user speed",
    )
    fig.tight_layout()
    fig.savefig(paths[1], dpi=100)
    plt.close(fig)
    return paths
