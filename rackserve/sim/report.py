"""Present simulator results: a rich summary table, JSON, and the two plots (matplotlib Agg)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from rich.table import Table  # noqa: E402

from rackserve.sim.metrics import SimResult  # noqa: E402

ROWS: tuple[tuple[str, str], ...] = (
    ("requests completed", "{r.completed} / {r.arrivals}"),
    ("rejected", "{r.rejected}"),
    ("preemptions (decode KV full)", "{r.preemptions}"),
    ("throughput / GPU (in+out tok/s)", "{r.throughput_per_gpu:,.0f}"),
    ("output tok/s / GPU", "{r.output_tps_per_gpu:,.0f}"),
    ("tok/s/user E2E-normalized P50 | P90 (AgentX)", "{r.tps_user_e2e_p50:,.1f} | {r.tps_user_e2e_p90:,.1f}"),
    ("tok/s/user ITL-based P50 | P90", "{r.tps_user_itl_p50:,.1f} | {r.tps_user_itl_p90:,.1f}"),
    ("TTFT P50 | P90 | P99 (ms)", "{ms[0]:,.1f} | {ms[1]:,.1f} | {ms[2]:,.1f}"),
    ("TPOT P50 | P90 (ms)", "{tp[0]:.2f} | {tp[1]:.2f}"),
    ("prefix hit rate (predicted)", "{r.hit_rate:.1%} ({r.predicted_hit_rate:.1%})"),
    ("  rank HBM | pool HBM | pool DRAM", "{h[rank_hbm]:.1%} | {h[pool_hbm]:.1%} | {h[pool_dram]:.1%}"),
    ("rank idle in steps: prefill | decode", "{r.prefill_idle_frac:.1%} | {r.decode_idle_frac:.1%}"),
    ("rank idle while work waits elsewhere: prefill | decode",
     "{r.prefill_idle_waiting_frac:.1%} | {r.decode_idle_waiting_frac:.1%}"),
    ("prefill busy (stepping share of the window)", "{r.prefill_util:.1%}"),
    ("decode seqs/rank mean | P90 | max (cap)", "{dl[seqs_per_rank_mean]:.1f} | {dl[seqs_per_rank_p90]:.0f} | "
     "{dl[seqs_per_rank_max]} ({dl[max_num_seqs]})"),
    ("decode tok/s/GPU | capacity at that batch", "{dl[tok_s_per_gpu]:,.0f} | {dl[capacity_tok_s_per_gpu_at_batch]:,.0f}"),
    ("bound: prefill", "{dl[bound][prefill]}"),
    ("bound: decode", "{dl[bound][decode]}"),
    ("valid (AgentX: overflow <= 1%, coverage >= 95%)", "{valid}"),
    ("pool occupancy HBM | DRAM", "{r.pool_occupancy[pool_hbm]:.1%} | {r.pool_occupancy[pool_dram]:.1%}"),
    ("pool working set | capacity (GB)", "{ws:,.0f} | {cap:,.0f}"),
    ("evictions rank | pool HBM | pool DRAM", "{e[rank_hbm]} | {e[pool_hbm]} | {e[pool_dram]}"),
    ("recomputed tok: rank | pHBM | pDRAM | in flight", "{rc[rank_hbm]:,} | {rc[pool_hbm]:,} | {rc[pool_dram]:,} | {rc[in_flight]:,}"),
    ("pool path busy: HBM rd | DRAM rd (busiest port)", "{pu[hbm]:.1%} | {pu[dram]:.1%}"),
    ("simulated span (s) | wall (s)", "{r.span_s:,.1f} | {r.wall_s:,.2f}"),
)


_NO_LOAD = {"seqs_per_rank_mean": 0.0, "seqs_per_rank_p90": 0.0, "seqs_per_rank_max": 0, "max_num_seqs": 0,
            "tok_s_per_gpu": 0.0, "capacity_tok_s_per_gpu_at_batch": 0.0, "bound": {"prefill": "", "decode": ""}}


def summary_table(results: Sequence[SimResult]) -> Table:
    table = Table(title=f"{results[0].scenario} ({results[0].gpus} GPUs)")
    table.add_column("metric")
    for r in results:
        table.add_column(r.policy, justify="right")
    for label, fmt in ROWS:
        cells = []
        for r in results:
            ms = (r.ttft_p50_s * 1e3, r.ttft_p90_s * 1e3, r.ttft_p99_s * 1e3)
            tp = (r.tpot_p50_s * 1e3, r.tpot_p90_s * 1e3)
            rc = {"rank_hbm": 0, "pool_hbm": 0, "pool_dram": 0, "in_flight": 0, **r.recomputed_tokens}
            pu = {"hbm": r.pool_path_util.get("pool_hbm_read_busiest_port", 0.0),
                  "dram": r.pool_path_util.get("pool_dram_read_busiest_port", 0.0)}
            dl = r.decode_load or _NO_LOAD
            valid = "yes" if r.valid else "NO: " + "; ".join(r.invalid_reasons)
            ws = (r.pool_trace.get("working_set_bytes") or [0.0])[-1] / 1e9
            cells.append(fmt.format(r=r, ms=ms, tp=tp, h=r.hit_rate_by_tier, e=r.evictions, rc=rc, pu=pu, dl=dl,
                                    valid=valid, ws=ws, cap=r.pool_capacity_bytes / 1e9))
        table.add_row(label, *cells)
    return table


def write_json(results: Sequence[SimResult], path: Path, extra: dict | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {**(extra or {}), "results": [r.to_dict() for r in results]}
    path.write_text(json.dumps(payload, indent=2, default=float) + "\n")


def plot_ttft_cdf(results: Sequence[SimResult], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        xs = np.sort(np.asarray(r.ttft_samples)) * 1e3
        if len(xs):
            ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=r.policy)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"TTFT CDF: {results[0].scenario}")
    save_figure(fig, ax, path)


def plot_throughput_vs_speed(results: Sequence[SimResult], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        ax.scatter([r.tps_user_e2e_p50], [r.throughput_per_gpu], label=f"{r.policy} P50")
        ax.scatter([r.tps_user_e2e_p90], [r.throughput_per_gpu], marker="x", label=f"{r.policy} P90")
    ax.set_xlabel("output tok/s per user, E2E-normalized (AgentX: TTFT counts)")
    ax.set_ylabel("throughput per GPU (input + output tok/s)")
    ax.set_title(f"Throughput vs interactivity: {results[0].scenario}")
    save_figure(fig, ax, path, fontsize=7)


def plot_pool_trace(results: Sequence[SimResult], path: Path) -> None:
    """The pool's working set (solid) and what it holds (dashed) over simulated time, against its
    capacity (dotted), per policy."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        tr = r.pool_trace
        if not tr.get("t_s"):
            continue
        (line,) = ax.plot(tr["t_s"], np.asarray(tr["working_set_bytes"]) / 1e9, label=f"{r.policy} working set")
        ax.plot(tr["t_s"], np.asarray(tr["held_bytes"]) / 1e9, linestyle="--", color=line.get_color())
        ax.axhline(r.pool_capacity_bytes / 1e9, linestyle=":", color=line.get_color(), linewidth=1)
    ax.set_xlabel("simulated s")
    ax.set_ylabel("GB: working set, held (dashed), capacity (dotted)")
    ax.set_title(f"KV pool: {results[0].scenario} (pool.scope {results[0].pool_scope})")
    save_figure(fig, ax, path, fontsize=7)


def save_figure(fig, ax, path: Path, fontsize: float | None = None) -> None:
    """Legend, grid, tight layout, written at 120 dpi and closed: the finish every simulator plot shares."""
    ax.legend(**({} if fontsize is None else {"fontsize": fontsize}))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
