"""Writes the Grafana dashboards (deploy/grafana/dashboards/*.json) from the panel lists below.

Run `python deploy/grafana/build_dashboards.py` after changing a panel; a test checks the JSON on
disk matches this file and runs every expression against a real Prometheus. Rates use
`$__rate_interval` (Grafana substitutes it; the test uses 1m). Latencies are simulated seconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DATASOURCE = {"type": "prometheus", "uid": "rackserve-prometheus"}
OUT_DIR = Path(__file__).parent / "dashboards"
R = "$__rate_interval"


@dataclass(frozen=True)
class Panel:
    title: str
    kind: str  # Grafana panel type: timeseries, heatmap, stat, bargauge
    targets: tuple[tuple[str, str], ...]  # (PromQL, legend format)
    unit: str = "short"
    description: str = ""


def quantiles(metric: str, by: str = "") -> tuple[tuple[str, str], ...]:
    """P50 and P90 of a histogram, summed over everything but `le` (and `by`)."""
    keys = f"le{', ' + by if by else ''}"
    legend = "{{" + by + "}} " if by else ""
    return tuple(
        (
            f"histogram_quantile({q}, sum by ({keys}) (rate({metric}_bucket[{R}])))",
            f"{legend}P{int(q * 100)}",
        )
        for q in (0.5, 0.9)
    )


def mean(metric: str) -> str:
    """Mean of a histogram over the rate window: rate of its sum over rate of its count."""
    return f"sum(rate({metric}_sum[{R}])) / sum(rate({metric}_count[{R}]))"


def idle_fraction() -> str:
    busy = f"sum by (instance, dp_rank) (rate(rackserve_rank_busy_seconds_total[{R}]))"
    idle = f"sum by (instance, dp_rank) (rate(rackserve_rank_idle_seconds_total[{R}]))"
    return f"{idle} / ({idle} + {busy})"


# Simulated tokens/s = wall tokens/s x time_scale (wall seconds per simulated second).
SIM_PER_WALL = "scalar(max(rackserve_time_scale))"
TOKENS_PER_GPU = f"sum(rate(rackserve_tokens_total[{R}])) * {SIM_PER_WALL} / scalar(sum(rackserve_instance_gpus))"
TOKS_PER_USER = f"1 / histogram_quantile({{q}}, sum by (le) (rate(rackserve_time_per_output_token_seconds_bucket[{R}])))"

OVERVIEW = (
    Panel("TTFT P50 / P90", "timeseries", quantiles("rackserve_time_to_first_token_seconds"), "s"),
    Panel(
        "TTFT breakdown (P50)",
        "timeseries",
        (
            (
                f"histogram_quantile(0.5, sum by (le, component) (rate(rackserve_ttft_component_seconds_bucket[{R}])))",
                "{{component}}",
            ),
        ),
        "s",
    ),
    Panel(
        "Throughput per GPU vs tok/s per user",
        "timeseries",
        (
            (TOKENS_PER_GPU, "tokens/s/GPU (cached+uncached+output)"),
            (TOKS_PER_USER.format(q=0.5), "tok/s/user P50"),
            (TOKS_PER_USER.format(q=0.9), "tok/s/user (TPOT P90)"),
        ),
        description="Per-GPU throughput counts cached, uncached and output tokens; tok/s/user = 1/TPOT.",
    ),
    Panel(
        "TPOT P50 / P90", "timeseries", quantiles("rackserve_time_per_output_token_seconds"), "s"
    ),
    Panel(
        "Inter-token latency P50 / P90",
        "timeseries",
        quantiles("rackserve_inter_token_latency_seconds"),
        "s",
    ),
    Panel(
        "E2E latency P50 / P90",
        "timeseries",
        quantiles("rackserve_e2e_request_latency_seconds"),
        "s",
    ),
    Panel(
        "Requests",
        "timeseries",
        (
            (f"sum by (status) (rate(rackserve_requests_total[{R}]))", "{{status}} req/s"),
            ("sum(rackserve_requests_in_flight)", "in flight"),
        ),
        "reqps",
    ),
    Panel(
        "Tokens/s by kind (wall clock)",
        "timeseries",
        ((f"sum by (kind) (rate(rackserve_tokens_total[{R}]))", "{{kind}}"),),
    ),
    Panel(
        "Prompt / generation tokens/s (vLLM names, wall clock)",
        "timeseries",
        (
            (f"sum(rate(vllm:prompt_tokens_total[{R}]))", "prompt"),
            (f"sum(rate(vllm:generation_tokens_total[{R}]))", "generation"),
        ),
        description="vLLM's counters: a prompt counts whole (cached tokens too) once its first token is out.",
    ),
    Panel(
        "Finished requests by reason",
        "timeseries",
        (
            (
                f"sum by (finished_reason) (increase(vllm:request_success_total[{R}]))",
                "{{finished_reason}}",
            ),
        ),
        description="vLLM's finished_reason: stop (EOS or stop string), length, abort (client gone), error.",
    ),
    Panel(
        "Request phases, mean: queue / prefill / decode",
        "timeseries",
        tuple(
            (mean(f"vllm:request_{phase}_time_seconds"), phase)
            for phase in ("queue", "prefill", "decode")
        ),
        "s",
        "vLLM's phases: waiting; scheduled to first token (KV hand-off included); first to last token.",
    ),
    Panel(
        "Prompt / generation length P50 / P90 (tokens)",
        "timeseries",
        tuple(
            (expr, f"{kind} {legend}")
            for kind in ("prompt", "generation")
            for expr, legend in quantiles(f"vllm:request_{kind}_tokens")
        ),
    ),
)

CACHE = (
    Panel(
        "Prefix hit rate by tier",
        "timeseries",
        (
            (
                f"sum by (tier) (rate(rackserve_prefix_tokens_total[{R}])) / scalar(sum(rate(rackserve_prefix_tokens_total[{R}])))",
                "{{tier}}",
            ),
        ),
        "percentunit",
        "Share of prompt tokens whose KV came from each tier (miss = computed).",
    ),
    Panel(
        "vLLM prefix cache hit rate",
        "stat",
        (
            (
                f"sum(rate(vllm:prefix_cache_hits_total[{R}])) / sum(rate(vllm:prefix_cache_queries_total[{R}]))",
                "hit rate",
            ),
        ),
        "percentunit",
    ),
    Panel(
        "Pool occupancy",
        "timeseries",
        (
            (
                "sum by (tier) (rackserve_pool_used_bytes) / sum by (tier) (rackserve_pool_capacity_bytes)",
                "{{tier}}",
            ),
        ),
        "percentunit",
    ),
    Panel("Pool blocks", "timeseries", (("sum by (tier) (rackserve_pool_blocks)", "{{tier}}"),)),
    Panel(
        "Pool evictions/s",
        "timeseries",
        ((f"sum by (tier) (rate(rackserve_pool_evictions_total[{R}]))", "{{tier}}"),),
    ),
    Panel(
        "Rank KV cache usage",
        "timeseries",
        (("vllm:kv_cache_usage_perc", "{{engine}}"),),
        "percentunit",
    ),
    Panel(
        "KV cache config (engines per setting)",
        "stat",
        (
            (
                "count by (block_size, num_gpu_blocks) (vllm:cache_config_info)",
                "{{num_gpu_blocks}} blocks of {{block_size}} tokens",
            ),
        ),
        description="vLLM's cache_config_info: one series per engine (rank), its KV cache as labels.",
    ),
)

RANKS = (
    Panel(
        "Idle time at the lockstep barrier (instance x rank)",
        "heatmap",
        ((idle_fraction(), "{{instance}}/{{dp_rank}}"),),
        "percentunit",
        "Fraction of simulated step time each rank waited for the slowest rank of its instance.",
    ),
    Panel(
        "Batch size per rank",
        "timeseries",
        (("sum by (instance, dp_rank) (rackserve_rank_batch_size)", "{{instance}}/{{dp_rank}}"),),
    ),
    Panel(
        "Batch size P50 / P90 by role",
        "timeseries",
        quantiles("rackserve_rank_batch_size_sequences", "role"),
    ),
    Panel(
        "Queued uncached tokens per rank",
        "timeseries",
        (
            (
                "sum by (instance, dp_rank) (rackserve_rank_queued_uncached_tokens)",
                "{{instance}}/{{dp_rank}}",
            ),
        ),
    ),
    Panel(
        "KV blocks used per rank",
        "timeseries",
        (
            (
                "sum by (instance, dp_rank) (rackserve_rank_kv_blocks_used)",
                "{{instance}}/{{dp_rank}}",
            ),
        ),
    ),
    Panel(
        "Tokens per engine step P50 / P90",
        "timeseries",
        quantiles("vllm:iteration_tokens_total", "engine"),
        description="vLLM's iteration_tokens_total: tokens a rank computed in one step (prompt chunks + sampled).",
    ),
    Panel(
        "Requests running / waiting (vLLM names)",
        "timeseries",
        (
            ("sum by (engine) (vllm:num_requests_running)", "{{engine}} running"),
            ("sum by (engine) (vllm:num_requests_waiting)", "{{engine}} waiting"),
        ),
    ),
    Panel(
        "Pacing lag (wall s per wall s)",
        "timeseries",
        (
            (
                f"sum by (instance) (rate(rackserve_rank_pacing_lag_seconds_total[{R}]))",
                "{{instance}}",
            ),
        ),
        description="Above 0: real compute overran the paced step budget; the twin fell behind its clock.",
    ),
)

ROUTER = (
    Panel(
        "Decision latency P50 / P90 (wall)",
        "timeseries",
        quantiles("rackserve_router_decision_wall_seconds"),
        "s",
    ),
    Panel(
        "Decisions/s by chosen rank",
        "timeseries",
        (
            (
                f"sum by (policy, role, instance, dp_rank) (rate(rackserve_router_decisions_total[{R}]))",
                "{{policy}} {{instance}}/{{dp_rank}}",
            ),
        ),
    ),
    Panel(
        "Predicted vs delivered cached tokens/s",
        "timeseries",
        (
            (f"sum(rate(rackserve_router_predicted_cached_tokens_total[{R}]))", "predicted"),
            (f"sum(rate(rackserve_delivered_cached_tokens_total[{R}]))", "delivered"),
        ),
    ),
    Panel(
        "Prediction error P90 (tokens per decision)",
        "timeseries",
        quantiles("rackserve_cached_tokens_prediction_error_tokens")[1:],
    ),
    Panel(
        "Routing regret per decision, mean (simulated)",
        "timeseries",
        (
            (
                f"sum by (policy) (rate(rackserve_router_regret_seconds_sum[{R}]))"
                f" / sum by (policy) (rate(rackserve_router_regret_seconds_count[{R}]))",
                "{{policy}}",
            ),
        ),
        "s",
    ),
    Panel("Index size (blocks)", "stat", (("max(rackserve_router_index_blocks)", "blocks"),)),
    Panel(
        "KV event lag P90 (wall)",
        "timeseries",
        quantiles("rackserve_router_event_lag_wall_seconds")[1:],
        "s",
    ),
    Panel("Stale publishers", "stat", (("max(rackserve_router_stale_publishers)", "stale"),)),
    Panel(
        "Migrations/s (requests moved off a failed rank)",
        "timeseries",
        (
            (
                f"sum by (from_role, to_role) (rate(rackserve_migrations_total[{R}]))",
                "{{from_role}} -> {{to_role}}",
            ),
        ),
    ),
)

DASHBOARDS = {
    "overview": ("rackserve: Overview", OVERVIEW),
    "cache": ("rackserve: Cache", CACHE),
    "ranks": ("rackserve: Ranks", RANKS),
    "router": ("rackserve: Router", ROUTER),
}


def panel_json(panel: Panel, panel_id: int) -> dict:
    width, height = 12, 8
    grid = {
        "x": (panel_id - 1) % 2 * width,
        "y": (panel_id - 1) // 2 * height,
        "w": width,
        "h": height,
    }
    body: dict = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": grid,
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DATASOURCE,
                "expr": expr,
                "legendFormat": legend,
            }
            for i, (expr, legend) in enumerate(panel.targets)
        ],
    }
    if panel.kind == "heatmap":
        # Each series (instance/rank) is one row; values are already fractions, not buckets.
        body["options"] = {
            "calculate": False,
            "yAxis": {"axisPlacement": "left"},
            "color": {"scheme": "Oranges"},
        }
    return body


def dashboard_json(slug: str, title: str, panels: tuple[Panel, ...]) -> dict:
    return {
        "uid": f"rackserve-{slug}",
        "title": title,
        "tags": ["rackserve"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "5s",
        "time": {"from": "now-15m", "to": "now"},
        "templating": {"list": []},
        "annotations": {"list": []},
        "panels": [panel_json(p, i + 1) for i, p in enumerate(panels)],
    }


def render() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {
        f"{slug}.json": json.dumps(dashboard_json(slug, title, panels), indent=2) + "\n"
        for slug, (title, panels) in DASHBOARDS.items()
    }


def main() -> None:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name, text in render().items():
        (OUT_DIR / name).write_text(text)
        print(f"wrote {OUT_DIR / name}")


if __name__ == "__main__":
    main()
