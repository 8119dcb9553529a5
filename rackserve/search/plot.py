"""frontier.json as a picture and a terminal table: each configuration's screened curve faint, the
replayed points as dots, the envelope bold, the targets marked."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from rich.table import Table  # noqa: E402


def plot_frontier(report: dict, path: Path) -> None:
    pc = report["percentile"]
    x = "tps_user_" + pc
    fig, ax = plt.subplots(figsize=(9, 5.5))
    curves: dict[str, list[dict]] = defaultdict(list)
    for p in report["points"]:
        if p["source"] == "screen":
            curves[p["config"]["label"]].append(p)
    for pts in curves.values():
        pts = sorted(pts, key=lambda p: p["concurrency"])
        ax.plot([p[x] for p in pts], [p["throughput_per_gpu"] for p in pts], color="0.8", lw=0.6, zorder=1)
    rep = [p for p in report["points"] if p["source"] == "replay"]
    ax.scatter([p[x] for p in rep], [p["throughput_per_gpu"] for p in rep], s=14, color="tab:blue", zorder=3,
               label="replayed points")
    env = sorted(report["envelope"][pc], key=lambda p: p[x])
    ax.plot([p[x] for p in env], [p["throughput_per_gpu"] for p in env], color="black", lw=2.2, zorder=4,
            label=f"envelope ({report['envelope_source']})")
    for t in report["targets"]:
        ax.axvline(t, color="tab:red", ls="--", lw=0.8)
        ax.text(t, ax.get_ylim()[1] * 0.97, f" {t:g}", color="tab:red", va="top", fontsize=8)
    ax.set_xlabel(f"interactivity, {pc.upper()} {report['interactivity'].upper()} (tok/s/user)")
    ax.set_ylabel("throughput per GPU (tok/s)")
    ax.set_title(f"{report['rack']}: {report['configs_screened']} configurations screened, {len(rep)} replayed")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def frontier_table(report: dict) -> Table:
    pc = report["percentile"]
    t = Table(title=f"{report['rack']}: envelope at {pc.upper()} {report['interactivity']} interactivity "
                    f"({report['envelope_source']})")
    for col in ("configuration", "lanes", "tok/s/GPU", f"tok/s/user {pc}", "TTFT p90 s", "source"):
        t.add_column(col)
    for p in report["envelope"][pc]:
        t.add_row(p["config"]["label"], f"{p['concurrency']:,}", f"{p['throughput_per_gpu']:,.0f}",
                  f"{p['tps_user_' + pc]:,.0f}", f"{p['ttft_p90_s']:.2f}", p["source"])
    for target, win in report["at_target"].items():
        what = "not reached" if win is None else f"{win['throughput_per_gpu']:,.0f} tok/s/GPU, {win['config']['label']}"
        t.add_row(f"at {target} tok/s/user", "", "", "", "", what)
    return t
