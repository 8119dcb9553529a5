"""The plot and the docs page of issue 50's pool-capacity sweep, from its result file alone
(bench/pool/capacity_sweep.py --render): nothing on the page is typed by hand."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

POLICY_ORDER = ("least-uncached-work", "dynamo-kv", "round-robin")
TB = 1e12


def _order(rows: list[dict]) -> list[dict]:
    pol = {p: i for i, p in enumerate(POLICY_ORDER)}
    return sorted(rows, key=lambda r: (r["lanes"], -r["fraction"], pol.get(r["policy"], 9)))


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def table(rows: list[dict]) -> str:
    head = ("| lanes | store (per host) | policy | completed | TTFT P50 s | TTFT P90 s | hit rank HBM | hit store "
            "| hit total | store evictions | prefill idle while work waits | prefill lockstep idle | decode idle while work waits |")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in _order(rows):
        tiers = r["hit_rate_by_tier"]
        store = tiers.get("pool_hbm", 0.0) + tiers.get("pool_dram", 0.0)
        cap = f"{r['capacity']} ({r['segment_bytes_per_host'] / 1e9:,.0f} GB)"
        out.append(f"| {r['lanes']:,} | {cap} | {r['policy']} | {r['completed']:,} | {r['ttft_p50_s']:.2f} | "
                   f"{r['ttft_p90_s']:.2f} | {_pct(tiers.get('rank_hbm', 0.0))} | {_pct(store)} | {_pct(r['hit_rate'])} | "
                   f"{r['evictions'].get('pool_dram', 0):,} | {_pct(r['prefill_idle_waiting_frac'])} | "
                   f"{_pct(r['prefill_idle_frac'])} | {_pct(r['decode_idle_waiting_frac'])} |")
    return "\n".join(out)


def findings(rows: list[dict]) -> str:
    """Per lane count and store size, each policy's completions and hit rate against
    least-uncached-work's: where routing starts to matter, read off the rows."""
    out = []
    for n in sorted({r["lanes"] for r in rows}):
        parts = []
        for frac in sorted({r["fraction"] for r in rows if r["lanes"] == n}, reverse=True):
            at = {r["policy"]: r for r in rows if r["lanes"] == n and r["fraction"] == frac}
            luw = at.get("least-uncached-work")
            if luw is None:
                continue
            vs = [f"{p} {at[p]['completed'] / max(luw['completed'], 1):.2f}x (hit {_pct(at[p]['hit_rate'])})"
                  for p in POLICY_ORDER[1:] if p in at]
            label = "holds everything" if frac == 1.0 else f"{frac:g} of the working set"
            parts.append(f"{label}: least-uncached-work {luw['completed']:,} (hit {_pct(luw['hit_rate'])}), "
                         + ", ".join(vs))
        out.append(f"- **{n:,} lanes**: " + "; ".join(parts) + ".")
    return "\n".join(out)


def reading(rows: list[dict]) -> str:
    """Where routing starts to matter and why, in figures read off the rows: with a store that holds
    everything, the hit-rate spread and round-robin's idle while work waits; below the largest
    store at which least-uncached-work loses 10% of its completions, rank HBM's share of its hits
    and the other policies' hit rates; where dynamo-kv beats it by more than 5%."""
    out = []
    for n in sorted({r["lanes"] for r in rows}):
        at = {(r["fraction"], r["policy"]): r for r in rows if r["lanes"] == n}
        full = {p: at[(1.0, p)] for p in POLICY_ORDER if (1.0, p) in at}
        if len(full) < len(POLICY_ORDER):
            continue
        luw, rr = full["least-uncached-work"], full["round-robin"]
        hits = [r["hit_rate"] for r in full.values()]
        text = (f"- **{n:,} lanes**: holding everything, the policies' hit rates are within "
                f"{100 * (max(hits) - min(hits)):.1f} points; round-robin completes "
                f"{rr['completed'] / luw['completed']:.2f}x, its prefill ranks idle while work waits "
                f"{_pct(rr['prefill_idle_waiting_frac'])} of the window (least-uncached-work "
                f"{_pct(luw['prefill_idle_waiting_frac'])}).")
        cliff = max((f for f, p in at if p == "least-uncached-work" and f < 1.0
                     and at[(f, p)]["completed"] < 0.9 * luw["completed"]), default=None)
        if cliff is not None:
            c = {p: at[(cliff, p)] for p in POLICY_ORDER if (cliff, p) in at}
            cl, crr = c["least-uncached-work"], c["round-robin"]
            text += (f" From {cliff:g} of the working set down the store evicts live conversations "
                     f"(least-uncached-work {cl['completed'] / luw['completed']:.2f}x of its own full-store "
                     f"completions): its rank HBM serves {_pct(cl['hit_rate_by_tier']['rank_hbm'])} of prompt tokens, "
                     f"round-robin's hit rate falls to {_pct(crr['hit_rate'])} and it completes "
                     f"{crr['completed'] / cl['completed']:.2f}x of least-uncached-work.")
        wins = [f for f, p in at if p == "dynamo-kv" and (f, "least-uncached-work") in at
                and at[(f, p)]["completed"] > 1.05 * at[(f, "least-uncached-work")]["completed"]]
        for f in sorted(wins, reverse=True):
            d, lw = at[(f, "dynamo-kv")], at[(f, "least-uncached-work")]
            text += (f" At {f:g} of the working set dynamo-kv completes {d['completed'] / lw['completed']:.2f}x of "
                     f"least-uncached-work, with {_pct(d['hit_rate_by_tier']['rank_hbm'])} of prompt tokens from rank "
                     f"HBM against {_pct(lw['hit_rate_by_tier']['rank_hbm'])}.")
        out.append(text)
    return "\n".join(out)


def plot(doc: dict, path: Path) -> None:
    rows = doc["rows"]
    lanes = sorted({r["lanes"] for r in rows})
    fig, axes = plt.subplots(2, len(lanes), figsize=(6 * len(lanes), 8.5), squeeze=False)
    colors = {p: c for p, c in zip(POLICY_ORDER, ("tab:blue", "tab:orange", "tab:green"), strict=True)}
    for col, n in enumerate(lanes):
        mine = [r for r in rows if r["lanes"] == n]
        ax = axes[0][col]
        for policy in POLICY_ORDER:
            pts = sorted((r["fraction"], r["completed"]) for r in mine if r["policy"] == policy)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=colors[policy], label=policy)
        ax.set_xscale("log")
        ax.set_xlabel("store capacity / working set of the run that holds everything")
        ax.set_ylabel(f"requests completed in {doc['window_s']:g} s")
        ax.set_title(f"{n:,} lanes")
        ax.legend(fontsize=8)
        ax = axes[1][col]
        for r in mine:
            if r["policy"] != "least-uncached-work":
                continue
            tr = r["pool_trace"]
            line, = ax.plot(tr["t_s"], [b / TB for b in tr["working_set_bytes"]], label=f"working set, {r['capacity']}")
            ax.plot(tr["t_s"], [b / TB for b in tr["held_bytes"]], linestyle="--", color=line.get_color())
            ax.axhline(r["pool_capacity_bytes"] / TB, color=line.get_color(), linestyle=":", linewidth=1)
        ax.set_yscale("log")
        ax.set_xlabel("simulated s (least-uncached-work)")
        ax.set_ylabel("TB: working set (solid), held (dashed), capacity (dotted)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def page(doc: dict, plot_name: str) -> str:
    rows = doc["rows"]
    hosts = rows[0]["hosts"] if rows else 0
    ws = {n: max(r["working_set_bytes"] for r in rows if r["lanes"] == n and r["fraction"] == 1.0)
          for n in sorted({r["lanes"] for r in rows}) if any(r["lanes"] == n and r["fraction"] == 1.0 for r in rows)}
    ws_text = "; ".join(f"{n:,} lanes {w / TB:.2f} TB" for n, w in ws.items())
    recipe = doc.get("recipe_store_bytes", 0.0)
    recipe_text = ", ".join(f"{recipe / w:.1f}x the working set at {n:,} lanes" for n, w in ws.items())
    return f"""# The KV store a deployment configures: capacity, eviction and routing

Generated by `python bench/pool/capacity_sweep.py --render` from `bench/results/pool/capacity_sweep.json`
(written by `{doc['command']}`); do not edit by hand.

`{doc['scenario']}` (3 DEP2 prefill instances + one Wide-EP 16 decode instance, the recorded AgentX
conversations) with `pool.scope: deployment`: one Mooncake-style store over the {hosts} trays the
deployment occupies, each host contributing `pool.segment_bytes_per_host` of DRAM, no spare HBM lent
(`pool.hbm_lent_bytes_per_gpu: 0`, the recipes' choice). The store first holds everything (each host's
whole DRAM), then a half, a quarter and a tenth of the working set that run measured ({ws_text}: the
distinct KV the deployment put, warm-ups included). Measured window: {doc['window_s']:g} s after a
{doc['measure_start_s']:g} s start ({doc['note']}). vLLM's MooncakeStoreConnector recipe (80 GB per GPU,
the default when `segment_bytes_per_host` is unset) gives this deployment {recipe / TB:.2f} TB: {recipe_text}
over this window, so the recipe's store holds everything here; the working set grows with the window.

"Idle while work waits": the share of the window a rank had nothing to compute while a request waited
at another rank of its role (what an operator reads off a dashboard); "lockstep idle": its share of its
own instance's steps spent waiting at the MoE barrier (the old figure). Hits are shares of prompt
tokens; "store" is the pool's tiers.

Where routing starts to matter, read off the rows:

{reading(rows)}

Completions of each policy against least-uncached-work's at the same lanes and store:

{findings(rows)}

{table(rows)}

![completed requests against store capacity, and the working set against capacity over time]({plot_name})
"""


def render(doc: dict, plot_path: Path, page_path: Path) -> None:
    plot(doc, plot_path)
    rel = Path("..") / plot_path.relative_to(page_path.parent.parent)
    page_path.write_text(page(doc, rel.as_posix()))
