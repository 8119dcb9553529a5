"""What each committed result under bench/ measures: its purpose, the script that writes it, the goal it
is held to and its headline figures, read from the file itself. bench/report.py renders this as
docs/benchmarks.md; a result not listed here is not on the page."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

Headline = Callable[[dict], str]


@dataclass(frozen=True)
class Result:
    path: str  # the result file, from the repository root
    command: str  # how to run it again (the script at its current path); "" where no script writes it
    what: str  # what it measures, in one sentence
    headline: Headline | None  # its headline figures, from the file's JSON (None: not JSON)
    goal: str = ""


@dataclass(frozen=True)
class Purpose:
    name: str
    folder: str  # where its scripts live
    about: str
    results: tuple[Result, ...]


def _p50(d: dict) -> str:
    return f"{d['p50']:.1f} ms"


def _median(values: list[float]) -> float:
    return statistics.median(values)


# -- calibration -----------------------------------------------------------------------------------
def _h200(d: dict) -> str:
    fam = d["heldout_by_family"]
    per = ", ".join(f"{k} {v['median_abs_pct']:.1f}% (n {v['n']})" for k, v in fam.items())
    return (f"held-out median error {d['heldout_all']['median_abs_pct']:.1f}% over {d['heldout_all']['n']} shapes "
            f"({d['heldout_before_fit_public_starts']['median_abs_pct']:.1f}% before the fit); by family: {per}")


def _expert_launch(d: dict) -> str:
    kinds = d["expert"]["heldout_by_kind"]
    launch = d["launch"]
    wins = ", ".join(f"{k} {v}" for k, v in d["expert"]["wins"].items())
    return (f"expert GEMMs held out: gate-up {kinds['expert_up']['median_abs_pct']:.1f}% "
            f"(max {kinds['expert_up']['max_abs_pct']:.1f}%, n {kinds['expert_up']['n']}), down "
            f"{kinds['expert_down']['median_abs_pct']:.1f}% (max {kinds['expert_down']['max_abs_pct']:.1f}%); "
            f"fastest kernel per shape: {wins}; launch gap {1e6 * launch['graph']['fit_gap_s']:.2f} us in graph "
            f"replay, {1e6 * launch['graph_pdl']['fit_gap_s']:.2f} us with PDL, "
            f"{1e6 * launch['eager_launch_s']['median']:.0f} us eager")


def _raw(d: dict) -> str:
    return f"{len(d['measurements'])} measurements on {d['device']} (torch {d['torch']}), {len(d['errors'])} errors"


def _comm(d: dict) -> str:
    checks = ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in d["checks"].items())
    return f"{len(d['records'])} records on {d['gpus']} GPU ({d['device']}): {checks}; no multi-GPU fit yet"


def _aic(d: dict) -> str:
    return "median ours/AIC: " + ", ".join(f"{k} {v['median_ratio']:.2f}x" for k, v in d["summary"].items())


def _validate_fit(d: dict) -> str:
    return (f"{len(d['rows'])} public points: median abs error {100 * d['median_abs_error_before']:.1f}% -> "
            f"{100 * d['median_abs_error_after']:.1f}% (leave-one-out {100 * d['loo_median_abs_error']:.1f}%); "
            + ", ".join(f"{k} {v:.3g}" for k, v in d["params"].items()))


# -- simulator -------------------------------------------------------------------------------------
def _sim(d: dict) -> str:
    ours = d["ours"][-1]
    dyn = d["dynamo_replay"]
    return (f"{d['commit']}, {ours['requests']:,} Mooncake requests, {ours['group_blocks']}-block groups: cold in a "
            f"fresh process {ours['fresh_cold_ms_per_request']:.3f} ms/request, warm {ours['warm_ms_per_request']:.3f}; "
            f"Dynamo's replay {dyn['ms_per_request']:.3f} (warm {d['ratio_ours_warm_over_dynamo'][-1]:.2f}x, "
            f"cold {d['ratio_ours_fresh_cold_over_dynamo'][-1]:.2f}x; goal {d['goal_ms_per_request']} ms/request)")


def _sim_agentx(d: dict) -> str:
    return (f"{d['commit']}, {d['lanes']:,} lanes x {d['simulated_s'] / 60:g} simulated min on {d['scenario']}: "
            f"{d['wall_s']:.1f} s wall (goal {d['goal_wall_s']:g} s), {d['requests']:,} requests, "
            f"{d['cpu_ms_per_request']:.3f} CPU ms/request; {d['ratio_wall_over_baseline']:.3f}x its baseline")


def _sim_point(rows: list) -> str:
    last = rows[-1]
    return (f"{len(rows)} rows; latest {last['commit']}: {last['lanes']:,} lanes, {last['window_s']:g} s window, "
            f"{last['cpu_s']:.1f} CPU s (goal 60), {last['max_rss_gb']:.2f} GB max RSS, {last['requests']:,} requests")


def _sim_bounds(d: dict) -> str:
    return f"{d['commit']}: " + "; ".join(
        f"{k} {b['factor_needed']:.1f}x from the goal, pricing {100 * b['pricing_share']:.0f}%"
        for k, b in d["bounds"].items())


def _sim_compiled(d: dict) -> str:
    r = d["ratio_compiled_over_pure"]
    return (f"{d['commit']}, {len(d['compiled_modules'])} modules compiled by Cython: warm "
            f"{r['warm_ms_per_request']:.2f}x, cold {r['cold_ms_per_request']:.2f}x the pure-Python tree")


def _step_pricing(d: dict) -> str:
    out = []
    for lanes in ("1024", "4096"):
        b, a = d["before"][lanes], d["after"][lanes]
        out.append(f"{lanes} lanes TPOT P50 {1e3 * b['tpot_p50_s']:.2f} -> {1e3 * a['tpot_p50_s']:.2f} ms, "
                   f"P90 E2E {b['tps_user_e2e_p90']:.0f} -> {a['tps_user_e2e_p90']:.0f} tok/s/user")
    return f"{d['before']['code']} -> {d['after']['code']}: " + "; ".join(out)


def _timing_speed(d: dict) -> str:
    rows = ", ".join(f"{r['case']} {r['us_per_call']:.0f} us" for r in d["rows"] if "reference" not in r["case"])
    return f"goal {d['goal_us']:g} us per typical decode call (met: {d['goal_met']}): {rows}"


def _lru(d: dict) -> str:
    return "per key: " + ", ".join(
        f"{r['entries']:,} entries {r['move_to_end_ns_per_key']:.0f} ns move_to_end / "
        f"{r['contains_ns_per_key']:.0f} ns membership" for r in d["rows"])


def _trace_source(d: dict) -> str:
    return (f"{d['lanes']:,} lanes, {d['duration_s']:g} s: {d['ours']['ms_per_request']:.3f} ms/request "
            f"({d['ours']['ms_per_1000_blocks']:.3f} per 1,000 blocks) against the first version's "
            f"{d['first_version']['ms_per_request']:.3f} ({d['speedup']:.2f}x)")


def _kv_replay(d: dict) -> str:
    return "; ".join(f"shrink {r['shrink']}: new/old CPU {r['ratio']:.2f}x ({r['calls']:,} calls, same state "
                     f"{r['same_state']})" for r in d["rows"])


def _frontier_memo(d: dict) -> str:
    return (f"{d['commit']}, {d['label']}: fresh {d['fresh_cpu_s']:.1f} CPU s; shared memo "
            f"{d['ratio_shared_over_fresh']:.2f}x, step store empty {d['ratio_stored_over_fresh']:.2f}x, filled "
            f"{d['ratio_stored_again_over_fresh']:.2f}x; figures equal: {d['figures_equal']}")


def _live_vs_sim(d: dict) -> str:
    rows = ", ".join(f"{r['metric']} {100 * r['rel_err']:+.1f}%" for r in d["rows"])
    return f"{d['config']}, {d['requests']} requests, {d['failed']} failed; live vs sim: {rows}"


def _timing_device(d: dict) -> str:
    return f"{len(d['runs'])} runs of bench/timing_speed.py on a {d['runs'][0]['cpu_count']}-core device host"


# -- front door ------------------------------------------------------------------------------------
def _overhead(d: dict) -> str:
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


def _rank_step(d: dict) -> str:
    return "step p50: " + ", ".join(f"{k} {v['step_p50_ms']:.1f} ms" for k, v in d["variants"].items())


def _ray_hop(d: dict) -> str:
    return ", ".join(f"{k} p50 {d[k]['p50_ms']:.2f} ms" for k in ("actor_call", "actor_call_rank_step", "compiled_graph"))


def _old_vs_new(d: dict) -> str:
    return f"{len(d['runs'])} runs: " + ", ".join(
        f"{r['run']} TTFT p50 {r['result']['cluster']['ttft_ms']['p50']:.1f} ms" for r in d["runs"])


# -- routing, pool, engine -------------------------------------------------------------------------
def _routing(d: dict) -> str:
    r, w = d["rackserve"], d["workload"]
    return (f"{w['prefill_ranks']} ranks, {w['indexed_entries']:,} indexed blocks: decision "
            f"{r['decision[least-uncached-work]']['median_us']:.1f} us median (least-uncached-work; goal "
            f"{d['goal_median_us']:g}), lookup {r['match']['median_us']:.1f} us vs Dynamo RadixTree "
            f"{d['dynamo_radix_tree']['find_matches']['median_us']:.1f} us; agreement {d['agreement_with_dynamo']:.0%}")


def _event_lag(d: dict) -> str:
    return (f"{d['events']:,} events: p50 {1e3 * d['lag_p50_s']:.2f} ms, p90 {1e3 * d['lag_p90_s']:.2f} ms, "
            f"p99 {1e3 * d['lag_p99_s']:.2f} ms")


def _kvpool(d: dict) -> str:
    rows = []
    for t in d["transfer"]:
        figs = ", ".join(f"{k.replace('_ratio', '').replace('_', ' ')} {v:.2f}x raw"
                         for k, v in t.items() if "_ratio" in k)
        rows.append(f"{t['block_bytes'] // 1024} KiB blocks: {figs}")
    return "; ".join(rows) + f"; MatchPrefix {d['match_prefix']['median_ms']:.2f} ms median"


def _scope_by_policy(d: dict) -> str:
    return f"{d['lanes']:,} lanes, {d['window_s']:g} s: " + "; ".join(
        f"{r['scope']}/{r['policy']} {r['completed']:,} done, TTFT P90 {r['ttft_p90_s']:.2f} s" for r in d["rows"])


def _numpy_vs_torch(d: dict) -> str:
    return f"goal {d['goal']}: " + ", ".join(f"{r['case']} {r['ratio_cpu']:.2f}x" for r in d["results"]) + " (CPU time)"


def _engram(d: dict) -> str:
    return "; ".join(f"{c['case']} over {c['shards']} shards {c['sharded']['median_ms']:.1f} ms median "
                     f"(in-process {c['in_process']['median_ms']:.2f} ms)" for c in d["cases"])


# -- clients, faults -------------------------------------------------------------------------------
def _clients(d: dict) -> str:
    return f"time_scale {d['time_scale']:g}: " + "; ".join(
        f"{r['client']} TTFT {r['ttft_ms']:.0f} ms (sim x scale {r['expected_ttft_ms']:.0f}), {_count(r['errors'])} errors"
        for r in d["rows"])


def _count(errors) -> int:
    return len(errors) if isinstance(errors, list) else errors


def _bench_client(d: dict) -> str:
    runs = ", ".join(f"{k} {v['req_per_s']:.1f} req/s" for k, v in d["runs"].items())
    return f"the client's ceiling is {d['headroom_x']:g}x the cluster's rate: {runs}"


def _chaos(d: dict) -> str:
    return "; ".join(f"{f['fault']}: {f['completed']}/{f['requests']} completed, {f['migrated']} migrated, "
                     f"{f['lost']} lost, serving again after {f['serving_again_after_s']} s" for f in d["faults"])


def _kv_pressure(d: dict) -> str:
    runs = "; ".join(f"{r['label']}: {sum(x['ok'] for x in r['rounds'])} ok, "
                     f"{sum(x['failed'] for x in r['rounds'])} failed, {r['preemptions']} preemptions" for r in d["runs"])
    return f"{runs}; greedy outputs identical: {d['greedy_outputs_identical']}"


def _overload(d: dict) -> str:
    return "; ".join(f"{lv['clients']} clients: {lv['completed']} done, {lv['rejected_429']} 429, "
                     f"{lv['shed_503']} 503, {lv['failed']} failed" for lv in d["levels"])


def _soak(d: dict) -> str:
    t = d["totals"]
    return (f"{len(d['minutes'])} min at {d['clients']} clients: {t['completed']:,} done, {t['failed']} failed; "
            f"RSS {d['rss_total_mib_start']:.0f} -> {d['rss_total_mib_end']:.0f} MiB")


def _md(_: dict) -> str:
    return "a page of tables (not JSON)"


PY = ".venv/bin/python"
SIM_NOTE = "(issue 51 is changing this script: it moves to bench/simulator/ once that lands)"

PURPOSES: tuple[Purpose, ...] = (
    Purpose("calibration", "bench/calibrate/", "The cost model against real kernels, published points and "
            "AIConfigurator.", (
        Result("bench/results/calibrate/h200.json", f"python3 bench/calibrate/h200_kernels.py --out $OUT/h200_raw.json "
               f"(on an H200), then {PY} bench/calibrate/fit.py --write-spec",
               "the H200 cost-model parameters fitted to measured dense GEMM, attention and copy kernels, held-out error",
               _h200, "held-out median error <= 10%"),
        Result("bench/results/calibrate/h200_raw.json", "python3 bench/calibrate/h200_kernels.py --out $OUT/h200_raw.json",
               "raw H200 kernel times, the fit's input", _raw),
        Result("bench/results/calibrate/h200_raw2.json",
               "python3 bench/calibrate/h200_kernels.py --extra --out $OUT/h200_raw2.json",
               "more raw H200 kernel times, the fit's second input", _raw),
        Result("bench/results/calibrate/expert_launch.json", "python3 bench/calibrate/h200_expert_launch.py --out $OUT "
               f"(on an H200), then {PY} bench/calibrate/fit_expert_launch.py --write-spec",
               "expert GEMM efficiencies fitted to the fastest kernel per shape, and the kernel launch gap",
               _expert_launch, "held-out median error <= 10%"),
        Result("bench/results/calibrate/expert_raw.json", "python3 bench/calibrate/h200_expert_launch.py --out $OUT",
               "raw expert-MLP kernel times by implementation", _raw),
        Result("bench/results/calibrate/launch_raw.json", "python3 bench/calibrate/h200_expert_launch.py --out $OUT",
               "raw kernel-chain launch times (graph, PDL, eager)", _raw),
        Result("bench/results/calibrate/comm_sanity.json",
               "python3 bench/calibrate/comm.py --sanity --out $OUT/comm_sanity.json",
               "NCCL all-reduce and all-to-all, the one-GPU sanity path", _comm),
        Result("bench/results/calibrate/aiconfigurator_compare.json", f"{PY} bench/calibrate/aiconfigurator_compare.py",
               "the cost model beside AIConfigurator on the same gb200/gb300 decode and prefill points", _aic,
               "record the gap"),
        Result("bench/results/validate_fit.json", "rackserve validate --fit",
               "system-level parameters fitted across the published points (docs/validation.md)", _validate_fit),
    )),
    Purpose("simulator", "bench/simulator/", "The simulator's speed, what bounds it, and how well it matches the "
            "live cluster. Until issue 51 lands, bench/sim.py, sim_bounds.py, sim_profile.py, sim_compiled.py, "
            "step_pricing.py, timing_speed.py (being changed there), sim_agentx.py and sim_point.py (whose results "
            "sim_bounds.py reads) and their helpers sampler.py and trees.py stay at bench/'s top level, their "
            "results in bench/results/.", (
        Result("bench/results/sim.json", f"{PY} bench/sim.py --baseline DIR --sample {SIM_NOTE}",
               "simulator speed per request on the Mooncake trace (dep2x12), beside Dynamo's offline replay", _sim,
               "warm <= 0.1x Dynamo's replay, cold <= 0.3x (issue 33)"),
        Result("bench/results/sim_agentx.json", f"{PY} bench/sim_agentx.py --lanes 10000 --minutes 10 --sample "
               "--baseline COMMIT (its results are read by bench/sim_bounds.py: it moves with issue 51)",
               "simulator speed on the real AgentX traces at rack scale", _sim_agentx,
               "10 simulated min at 10,000 lanes in <= 30 s wall"),
        Result("bench/results/sim_point.json", f"{PY} bench/sim_point.py --baseline COMMIT --sample (read by "
               "bench/sim_bounds.py: it moves with issue 51)", "one 900 s AgentX frontier point: CPU s and peak "
               "memory in a fresh process (bench/results/sim_point.md is generated from it)", _sim_point,
               "<= 60 CPU s at 8,192 lanes"),
        Result("bench/results/sim_bounds.json", f"{PY} bench/sim_bounds.py --lanes 2048 --minutes 3 {SIM_NOTE}",
               "what bounds each simulator speed goal: pricing's share, calls per request against the budget "
               "(bench/results/sim_bounds.md is generated from it)", _sim_bounds),
        Result("bench/results/sim_compiled.json", f"{PY} bench/sim_compiled.py {SIM_NOTE}",
               "the simulator's hot modules compiled by Cython as they are, against pure Python", _sim_compiled),
        Result("bench/results/sim_profile.md", f"{PY} bench/sim_profile.py {SIM_NOTE}",
               "cProfile tables of a warm Mooncake and AgentX run (pasted by hand)", None),
        Result("bench/results/step_pricing.json", f"{PY} bench/step_pricing.py {SIM_NOTE}",
               "issue 31's step-pricing fixes, before and after, on nvl72-vr200", _step_pricing),
        Result("bench/results/timing_speed.json", f"{PY} bench/timing_speed.py {SIM_NOTE}",
               "CPU time of one step_time call of the timing model", _timing_speed,
               "<= 20 us per typical decode call"),
        Result("bench/notes/timing_speed_device_host.json", f"{PY} bench/timing_speed.py (on the device host)",
               "the same on an idle 16-core host (an investigation note)", _timing_device),
        Result("bench/results/simulator/lru_key_cost.json", f"{PY} bench/simulator/lru_key_cost.py",
               "one key's LRU touch and membership test on tables of growing size: the floor of a per-key KV model",
               _lru),
        Result("bench/results/simulator/trace_source_cost.json", f"{PY} bench/simulator/trace_source_cost.py "
               "--lanes 2000 --duration 600", "the AgentX trace-replay source's own cost per request", _trace_source),
        Result("bench/results/simulator/kv_replay.json", f"{PY} bench/simulator/kv_replay.py record, then compare "
               "--baseline DIR", "the simulator's KV calls of one AgentX run replayed on this tree and an older one",
               _kv_replay),
        Result("bench/results/simulator/frontier_memo.json", f"{PY} bench/simulator/frontier_memo.py",
               "what a shared step-cost memo and a step store save a frontier search's replays", _frontier_memo),
        Result("bench/results/simulator/live_vs_sim_rack.json", f"{PY} bench/simulator/live_vs_sim.py --config "
               "scenarios/nvl72-vr200.yaml --engine mock --time-scale auto --sessions 96 --rate 400 "
               "--out bench/results/simulator/live_vs_sim_rack.json",
               "the live cluster (mock ranks) against the simulator on the same arrivals, rack scale", _live_vs_sim,
               "TTFT, TPOT, hit rate, rank idle within 10%"),
    )),
    Purpose("front door", "bench/frontdoor/", "What the router, gRPC, Ray and the P->D hand-off add over the engine "
            "in-process, beside Dynamo's frontend; one script, `overhead.py`, with options (`--dynamo`, "
            "`--dynamo-mode`, `--engine mock`, `--mock-ranks`, `--only dynamo|floor`).", (
        Result("bench/results/frontdoor/overhead.json", f"{PY} bench/frontdoor/overhead.py --dynamo --requests 200 "
               "(and --engine mock --mock-ranks service|actor --dynamo --dynamo-mode disagg|agg)",
               "front-door TTFT and ITL overhead, stage by stage, CPU per request by role, the bare-hop floor, "
               "and Dynamo 1.6.1's frontend + mocker under the same load", _overhead,
               "TTFT overhead no more than Dynamo's"),
        Result("bench/notes/frontdoor_rank_step.json", f"{PY} bench/notes/frontdoor_rank_step.py",
               "the prefill rank's step taken apart: engine, RankWorker, actor (an investigation note)", _rank_step),
        Result("bench/notes/frontdoor_ray_hop.json", f"flock /tmp/rackserve-ray.lock {PY} bench/notes/frontdoor_ray_hop.py",
               "one Ray actor call by transport (an investigation note)", _ray_hop),
        Result("bench/notes/frontdoor_old_vs_new.json", "bench/frontdoor/overhead.py on two trees, alternating",
               "A/B of the front door against an older commit (an investigation note)", _old_vs_new),
        Result("bench/notes/frontdoor_stages.md", "", "where the front door's TTFT goes, hop by hop, and what was "
               "tried to cut it (an investigation note)", None),
    )),
    Purpose("routing", "bench/routing/", "The router's decision and the KV events it follows.", (
        Result("bench/results/routing/decision_latency.json", f"{PY} bench/routing/decision_latency.py",
               "routing decision latency with 24 prefill ranks and ~1M indexed blocks, beside Dynamo's RadixTree",
               _routing, "<= 50 us"),
        Result("bench/results/routing/event_lag.json", f"{PY} bench/routing/event_lag.py",
               "a KV event's lag from the publisher's XADD to the router's follower (the simulator's event_lag_s)",
               _event_lag),
    )),
    Purpose("pool", "bench/pool/", "The KV pool: its transfer protocol against raw Redis, and (simulated) its scope "
            "under each routing policy.", (
        Result("bench/results/pool/transfer_vs_redis.json", f"{PY} bench/pool/transfer_vs_redis.py --rounds 40",
               "KV pool block put/get against raw redis-py on the same server; MatchPrefix latency", _kvpool,
               "pool >= 0.8x raw"),
        Result("bench/results/pool/scope_by_policy_1536.json", f"{PY} bench/pool/scope_by_policy.py --lanes 1536 "
               "--start-s 60 --window-s 900", "pool scope {rack, instance, agentx} x routing policy on "
               "agentx-3dep2-wideep (issue 32)", _scope_by_policy),
        Result("bench/results/pool/scope_by_policy_4800.json", f"{PY} bench/pool/scope_by_policy.py --lanes 4800 "
               "--start-s 60 --window-s 900", "the same at 4,800 lanes (saturated)", _scope_by_policy),
    )),
    Purpose("engine", "bench/engine/", "The numpy MoE engine and the Engram table.", (
        Result("bench/results/engine/numpy_vs_torch.json", f"{PY} bench/engine/numpy_vs_torch.py --threads 1",
               "the numpy engine's prefill and decode tokens/s against the same model in PyTorch (CPU)",
               _numpy_vs_torch, ">= 0.8x everywhere"),
        Result("bench/results/engine/engram_lookup.json", f"{PY} bench/engine/engram_lookup.py --shards 4",
               "Engram batched lookup over shard processes, beside the in-process table", _engram),
    )),
    Purpose("clients", "bench/clients/", "Outside load clients (AIPerf, guidellm, vllm bench serve) against the "
            "twin, and the bench client's own ceiling.", (
        Result("bench/results/clients/outside_clients.json", f"{PY} bench/clients/outside_clients.py --time-scale auto "
               "(bench/clients/guidellm.py, bench/clients/vllm_bench.py build those clients' venvs)",
               "each client's wall-clock TTFT and ITL beside the twin's simulated figures x time_scale", _clients,
               "0 failures; client figures = simulated x time_scale"),
        Result("bench/results/clients/outside_clients_fast_clock.json", f"{PY} bench/clients/outside_clients.py "
               "--time-scale 0.002 --out outside_clients_fast_clock.json",
               "the same at the test suite's time_scale, where the clock cannot hold", _clients),
        Result("bench/results/clients/bench_client_overhead.json", f"{PY} bench/clients/bench_client_overhead.py "
               "--url http://127.0.0.1:8000", "`rackserve bench`'s own ceiling against an instant endpoint and the "
               "cluster's rate", _bench_client, "not the bottleneck"),
    )),
    Purpose("faults", "bench/faults/", "The cluster under faults, KV pressure, overload and a long soak. "
            "bench/chaos.py and its result stay at the top level until the Ray-head work of issue 49 lands.", (
        Result("bench/results/chaos.json", f"flock /tmp/rackserve-ray.lock {PY} bench/chaos.py",
               "each process killed once under load: completed, migrated, lost, time until serving again "
               "(the README's failure table)", _chaos, "nothing lost"),
        Result("bench/results/faults/kv_pressure.json", f"flock /tmp/rackserve-ray.lock {PY} bench/faults/kv_pressure.py",
               "3 rounds of 64 streams as configured and with a KV-starved engine: failures, preemptions, "
               "greedy outputs", _kv_pressure, "0 failed"),
        Result("bench/results/faults/overload.json", f"{PY} bench/faults/overload.py --levels 2 8 16 32",
               "N concurrent clients up to and past the admission limit: done, 429, 503, failed", _overload,
               "0 failed"),
        Result("bench/results/faults/soak.json", f"{PY} bench/faults/soak.py --minutes 10 --clients 6",
               "a steady load for 10 minutes, RSS sampled each minute", _soak, "0 failed, no memory growth"),
        Result("bench/notes/load_soak_gcs_cap.json", f"{PY} bench/faults/soak.py --minutes 4 --clients 6",
               "the soak after capping Ray's GCS task events (an investigation note)", _soak),
    )),
)

# Results that other commands write and other pages show: named here so the page can point at them.
ELSEWHERE = (
    ("bench/results/frontier/", "rackserve sim frontier", "results.md"),
    ("bench/results/sensitivity/", "rackserve sim sensitivity", "results.md"),
    ("bench/results/validate/", "rackserve validate", "validation.md"),
)
