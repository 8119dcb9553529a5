"""The headline figures of each result file under bench/, from its JSON: one function per kind of result,
a dict in, one line of figures out (bench/catalog.py names which one reads which file)."""

from __future__ import annotations


def _p50(d: dict) -> str:
    return f"{d['p50']:.1f} ms"


# -- calibration -----------------------------------------------------------------------------------
def h200(d: dict) -> str:
    fam = d["heldout_by_family"]
    per = ", ".join(f"{k} {v['median_abs_pct']:.1f}% (n {v['n']})" for k, v in fam.items())
    return (f"held-out median error {d['heldout_all']['median_abs_pct']:.1f}% over {d['heldout_all']['n']} shapes "
            f"({d['heldout_before_fit_public_starts']['median_abs_pct']:.1f}% before the fit); by family: {per}")


def expert_launch(d: dict) -> str:
    kinds = d["expert"]["heldout_by_kind"]
    launch = d["launch"]
    wins = ", ".join(f"{k} {v}" for k, v in d["expert"]["wins"].items())
    return (f"expert GEMMs held out: gate-up {kinds['expert_up']['median_abs_pct']:.1f}% "
            f"(max {kinds['expert_up']['max_abs_pct']:.1f}%, n {kinds['expert_up']['n']}), down "
            f"{kinds['expert_down']['median_abs_pct']:.1f}% (max {kinds['expert_down']['max_abs_pct']:.1f}%); "
            f"fastest kernel per shape: {wins}; launch gap {1e6 * launch['graph']['fit_gap_s']:.2f} us in graph "
            f"replay, {1e6 * launch['graph_pdl']['fit_gap_s']:.2f} us with PDL, "
            f"{1e6 * launch['eager_launch_s']['median']:.0f} us eager")


def raw(d: dict) -> str:
    return f"{len(d['measurements'])} measurements on {d['device']} (torch {d['torch']}), {len(d['errors'])} errors"


def comm(d: dict) -> str:
    checks = ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in d["checks"].items())
    return f"{len(d['records'])} records on {d['gpus']} GPU ({d['device']}): {checks}; no multi-GPU fit yet"


def aic(d: dict) -> str:
    return "median ours/AIC: " + ", ".join(f"{k} {v['median_ratio']:.2f}x" for k, v in d["summary"].items())


def validate_fit(d: dict) -> str:
    return (f"{len(d['rows'])} public points: median abs error {100 * d['median_abs_error_before']:.1f}% -> "
            f"{100 * d['median_abs_error_after']:.1f}% (leave-one-out {100 * d['loo_median_abs_error']:.1f}%); "
            + ", ".join(f"{k} {v:.3g}" for k, v in d["params"].items()))


# -- simulator -------------------------------------------------------------------------------------
def sim(d: dict) -> str:
    """bench/simulator/vs_dynamo.py's interleaved rounds (issue 51): per trace, our cold and warm CPU ms per request, Dynamo's."""
    parts = []
    for name, t in d["traces"].items():
        ours, dyn = t["ours"], t.get("dynamo")
        peer = (f"Dynamo {dyn['cpu_ms_per_request']:.3f} (cold {ours['cold_cpu_ms_per_request'] / dyn['cpu_ms_per_request']:.2f}x, "
                f"goal {d['goal']['cold_cpu_over_dynamo'].get(name, '-')}x)" if dyn else "Dynamo not run here")
        parts.append(f"{name} ({t['requests']:,} requests): cold {ours['cold_cpu_ms_per_request']:.3f}, warm "
                     f"{ours['warm_cpu_ms_per_request']:.3f} CPU ms/request; {peer}")
    loads = [x for t in d["traces"].values() for x in t.get("load_average_1m", [])]
    load = f"; load {min(loads):.1f}-{max(loads):.1f}" if loads else ""
    return f"{d['commit']}: " + "; ".join(parts) + load


def sim_agentx(d: dict) -> str:
    return (f"{d['commit']}, {d['lanes']:,} lanes x {d['simulated_s'] / 60:g} simulated min on {d['scenario']}: "
            f"{d['wall_s']:.1f} s wall (goal {d['goal_wall_s']:g} s), {d['requests']:,} requests, "
            f"{d['cpu_ms_per_request']:.3f} CPU ms/request; {d['ratio_wall_over_baseline']:.3f}x its baseline")


def sim_point(rows: list) -> str:
    last = rows[-1]
    return (f"{len(rows)} rows; latest {last['commit']}: {last['lanes']:,} lanes, {last['window_s']:g} s window, "
            f"{last['cpu_s']:.1f} CPU s (goal 60), {last['max_rss_gb']:.2f} GB max RSS, {last['requests']:,} requests")


def sim_bounds(d: dict) -> str:
    return f"{d['commit']}: " + "; ".join(
        f"{k} {b['factor_needed']:.1f}x from the goal, pricing {100 * b['pricing_share']:.0f}%"
        for k, b in d["bounds"].items())


def sim_compiled(d: dict) -> str:
    r = d["ratio_compiled_over_pure"]
    return (f"{d['commit']}, {len(d['compiled_modules'])} modules compiled by Cython: warm "
            f"{r['warm_ms_per_request']:.2f}x, cold {r['cold_ms_per_request']:.2f}x the pure-Python tree")


def step_pricing(d: dict) -> str:
    out = []
    for lanes in ("1024", "4096"):
        b, a = d["before"][lanes], d["after"][lanes]
        out.append(f"{lanes} lanes TPOT P50 {1e3 * b['tpot_p50_s']:.2f} -> {1e3 * a['tpot_p50_s']:.2f} ms, "
                   f"P90 E2E {b['tps_user_e2e_p90']:.0f} -> {a['tps_user_e2e_p90']:.0f} tok/s/user")
    return f"{d['before']['code']} -> {d['after']['code']}: " + "; ".join(out)


def timing_speed(d: dict) -> str:
    rows = ", ".join(f"{r['case']} {r['us_per_call']:.0f} us" for r in d["rows"] if "reference" not in r["case"])
    return f"goal {d['goal_us']:g} us per typical decode call (met: {d['goal_met']}): {rows}"


def lru(d: dict) -> str:
    return "per key: " + ", ".join(
        f"{r['entries']:,} entries {r['move_to_end_ns_per_key']:.0f} ns move_to_end / "
        f"{r['contains_ns_per_key']:.0f} ns membership" for r in d["rows"])


def trace_source(d: dict) -> str:
    return (f"{d['lanes']:,} lanes, {d['duration_s']:g} s: {d['ours']['ms_per_request']:.3f} ms/request "
            f"({d['ours']['ms_per_1000_blocks']:.3f} per 1,000 blocks) against the first version's "
            f"{d['first_version']['ms_per_request']:.3f} ({d['speedup']:.2f}x)")


def kv_replay(d: dict) -> str:
    return "; ".join(f"shrink {r['shrink']}: new/old CPU {r['ratio']:.2f}x ({r['calls']:,} calls, same state "
                     f"{r['same_state']})" for r in d["rows"])


def frontier_memo(d: dict) -> str:
    return (f"{d['commit']}, {d['label']}: fresh {d['fresh_cpu_s']:.1f} CPU s; shared memo "
            f"{d['ratio_shared_over_fresh']:.2f}x, step store empty {d['ratio_stored_over_fresh']:.2f}x, filled "
            f"{d['ratio_stored_again_over_fresh']:.2f}x; figures equal: {d['figures_equal']}")


def live_vs_sim(d: dict) -> str:
    rows = ", ".join(f"{r['metric']} {100 * r['rel_err']:+.1f}%" for r in d["rows"])
    return f"{d['config']}, {d['requests']} requests, {d['failed']} failed; live vs sim: {rows}"


def timing_device(d: dict) -> str:
    return f"{len(d['runs'])} runs of bench/simulator/timing_speed.py on a {d['runs'][0]['cpu_count']}-core device host"


# -- front door ------------------------------------------------------------------------------------
def overhead(d: dict) -> str:
    c, local, ovh = d["cluster"], d["in_process"], d["overhead_ms"]
    text = (f"cluster TTFT p50 {_p50(c['ttft_ms'])} vs in-process {_p50(local['ttft_ms'])} (+{ovh['ttft_p50']:.1f} ms), "
            f"ITL +{ovh['itl_p50']:.2f} ms, {c['requests_per_s']:.1f} req/s; floor: bare HTTP hop "
            f"{d['floor']['uvloop']['http_sse_ttft_ms']['p50']:.2f} ms, bare gRPC call "
            f"{d['floor']['uvloop']['grpc_unary_ms']['p50']:.2f} ms")
    if d.get("dynamo_ratio"):
        text += (f"; Dynamo non-streamed {_p50(d['dynamo']['non_stream_e2e_ms'])}: ours "
                 f"{d['dynamo_ratio']['ttft_p50_ours_overhead_over_dynamo_non_stream_e2e']:.1f}x")
    runs = d.get("ttft_p50_mock_overhead_over_dynamo", {}).get("runs", {})
    if runs:
        text += "; mock ranks over Dynamo (streamed / non-streamed): " + ", ".join(
            f"{k} {v['streamed']:.2f}x / {v['non_streamed']:.2f}x" for k, v in runs.items())
    return text


def rank_step(d: dict) -> str:
    return "step p50: " + ", ".join(f"{k} {v['step_p50_ms']:.1f} ms" for k, v in d["variants"].items())


def ray_hop(d: dict) -> str:
    return ", ".join(f"{k} p50 {d[k]['p50_ms']:.2f} ms" for k in ("actor_call", "actor_call_rank_step", "compiled_graph"))


def old_vs_new(d: dict) -> str:
    return f"{len(d['runs'])} runs: " + ", ".join(
        f"{r['run']} TTFT p50 {r['result']['cluster']['ttft_ms']['p50']:.1f} ms" for r in d["runs"])


# -- routing, pool, engine -------------------------------------------------------------------------
def routing(d: dict) -> str:
    r, w = d["rackserve"], d["workload"]
    return (f"{w['prefill_ranks']} ranks, {w['indexed_entries']:,} indexed blocks: decision "
            f"{r['decision[least-uncached-work]']['median_us']:.1f} us median (least-uncached-work; goal "
            f"{d['goal_median_us']:g}), lookup {r['match']['median_us']:.1f} us vs Dynamo RadixTree "
            f"{d['dynamo_radix_tree']['find_matches']['median_us']:.1f} us; agreement {d['agreement_with_dynamo']:.0%}")


def event_lag(d: dict) -> str:
    return (f"{d['events']:,} events: p50 {1e3 * d['lag_p50_s']:.2f} ms, p90 {1e3 * d['lag_p90_s']:.2f} ms, "
            f"p99 {1e3 * d['lag_p99_s']:.2f} ms")


def kvpool(d: dict) -> str:
    rows = []
    for t in d["transfer"]:
        figs = ", ".join(f"{k.replace('_ratio', '').replace('_', ' ')} {v:.2f}x raw"
                         for k, v in t.items() if "_ratio" in k)
        rows.append(f"{t['block_bytes'] // 1024} KiB blocks: {figs}")
    return "; ".join(rows) + f"; MatchPrefix {d['match_prefix']['median_ms']:.2f} ms median"


def scope_by_policy(d: dict) -> str:
    return f"{d['lanes']:,} lanes, {d['window_s']:g} s: " + "; ".join(
        f"{r['scope']}/{r['policy']} {r['completed']:,} done, TTFT P90 {r['ttft_p90_s']:.2f} s" for r in d["rows"])


def capacity_sweep(d: dict) -> str:
    """Per lanes, at the smallest store: each policy's completions against least-uncached-work's."""
    out = []
    for n in sorted({r["lanes"] for r in d["rows"]}):
        low = min(r["fraction"] for r in d["rows"] if r["lanes"] == n)
        at = {r["policy"]: r for r in d["rows"] if r["lanes"] == n and r["fraction"] == low}
        luw = at.get("least-uncached-work")
        if luw:
            out.append(f"{n:,} lanes, store {low:g} of the working set: least-uncached-work {luw['completed']:,} done, "
                       + ", ".join(f"{p} {r['completed'] / max(luw['completed'], 1):.2f}x" for p, r in at.items()
                                   if p != "least-uncached-work"))
    return f"{d['window_s']:g} s: " + "; ".join(out)


def numpy_vs_torch(d: dict) -> str:
    return f"goal {d['goal']}: " + ", ".join(f"{r['case']} {r['ratio_cpu']:.2f}x" for r in d["results"]) + " (CPU time)"


def engram(d: dict) -> str:
    return "; ".join(f"{c['case']} over {c['shards']} shards {c['sharded']['median_ms']:.1f} ms median "
                     f"(in-process {c['in_process']['median_ms']:.2f} ms)" for c in d["cases"])


# -- clients, faults -------------------------------------------------------------------------------
def clients(d: dict) -> str:
    return f"time_scale {d['time_scale']:g}: " + "; ".join(
        f"{r['client']} TTFT {r['ttft_ms']:.0f} ms (sim x scale {r['expected_ttft_ms']:.0f}), {_count(r['errors'])} errors"
        for r in d["rows"])


def _count(errors) -> int:
    return len(errors) if isinstance(errors, list) else errors


def bench_client(d: dict) -> str:
    runs = ", ".join(f"{k} {v['req_per_s']:.1f} req/s" for k, v in d["runs"].items())
    return f"the client's ceiling is {d['headroom_x']:g}x the cluster's rate: {runs}"


def chaos(d: dict) -> str:
    return "; ".join(f"{f['fault']}: {f['completed']}/{f['requests']} completed, {f['migrated']} migrated, "
                     f"{f['lost']} lost, serving again after {f['serving_again_after_s']} s" for f in d["faults"])


def kv_pressure(d: dict) -> str:
    runs = "; ".join(f"{r['label']}: {sum(x['ok'] for x in r['rounds'])} ok, "
                     f"{sum(x['failed'] for x in r['rounds'])} failed, {r['preemptions']} preemptions" for r in d["runs"])
    return f"{runs}; greedy outputs identical: {d['greedy_outputs_identical']}"


def overload(d: dict) -> str:
    return "; ".join(f"{lv['clients']} clients: {lv['completed']} done, {lv['rejected_429']} 429, "
                     f"{lv['shed_503']} 503, {lv['failed']} failed" for lv in d["levels"])


def soak(d: dict) -> str:
    t = d["totals"]
    return (f"{len(d['minutes'])} min at {d['clients']} clients: {t['completed']:,} done, {t['failed']} failed; "
            f"RSS {d['rss_total_mib_start']:.0f} -> {d['rss_total_mib_end']:.0f} MiB")


def md(_: dict) -> str:
    return "a page of tables (not JSON)"
