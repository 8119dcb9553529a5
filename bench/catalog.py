"""What each committed result under bench/ measures: its purpose, the script that writes it, the goal it
is held to and its headline figures, read from the file itself. bench/report.py renders this as
docs/benchmarks.md; a result not listed here is not on the page."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bench import headlines

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


PY = ".venv/bin/python"

PURPOSES: tuple[Purpose, ...] = (
    Purpose("calibration", "bench/calibrate/", "The cost model against real kernels, published points and "
            "AIConfigurator.", (
        Result("bench/results/calibrate/h200.json", f"python3 bench/calibrate/h200_kernels.py --out $OUT/h200_raw.json "
               f"(on an H200), then {PY} bench/calibrate/fit.py --write-spec",
               "the H200 cost-model parameters fitted to measured dense GEMM, attention and copy kernels, held-out error",
               headlines.h200, "held-out median error <= 10%"),
        Result("bench/results/calibrate/h200_raw.json", "python3 bench/calibrate/h200_kernels.py --out $OUT/h200_raw.json",
               "raw H200 kernel times, the fit's input", headlines.raw),
        Result("bench/results/calibrate/h200_raw2.json",
               "python3 bench/calibrate/h200_kernels.py --extra --out $OUT/h200_raw2.json",
               "more raw H200 kernel times, the fit's second input", headlines.raw),
        Result("bench/results/calibrate/expert_launch.json", "python3 bench/calibrate/h200_expert_launch.py --out $OUT "
               f"(on an H200), then {PY} bench/calibrate/fit_expert_launch.py --write-spec",
               "expert GEMM efficiencies fitted to the fastest kernel per shape, and the kernel launch gap",
               headlines.expert_launch, "held-out median error <= 10%"),
        Result("bench/results/calibrate/expert_raw.json", "python3 bench/calibrate/h200_expert_launch.py --out $OUT",
               "raw expert-MLP kernel times by implementation", headlines.raw),
        Result("bench/results/calibrate/launch_raw.json", "python3 bench/calibrate/h200_expert_launch.py --out $OUT",
               "raw kernel-chain launch times (graph, PDL, eager)", headlines.raw),
        Result("bench/results/calibrate/comm_sanity.json",
               "python3 bench/calibrate/comm.py --sanity --out $OUT/comm_sanity.json",
               "NCCL all-reduce and all-to-all, the one-GPU sanity path", headlines.comm),
        Result("bench/results/calibrate/aiconfigurator_compare.json", f"{PY} bench/calibrate/aiconfigurator_compare.py",
               "the cost model beside AIConfigurator on the same gb200/gb300 decode and prefill points", headlines.aic,
               "record the gap"),
        Result("bench/results/validate_fit.json", "rackserve validate --fit",
               "system-level parameters fitted across the published points (docs/validation.md)", headlines.validate_fit),
    )),
    Purpose("simulator", "bench/simulator/", "The simulator's speed, what bounds it, and how well it matches the "
            "live cluster; `sampler.py` (a SIGPROF profiler) and `trees.py` (older commits' trees) are their "
            "helpers.", (
        Result("bench/results/simulator/vs_dynamo.json", f"{PY} bench/simulator/vs_dynamo.py --rounds 3 "
               "--traces mooncake,agentx --twins", "simulator speed per request, cold and warm, on the Mooncake "
               "trace (dep2x12) and AgentX conversations written as one, beside Dynamo's offline replay", headlines.sim,
               "warm <= 0.1x Dynamo's replay, cold <= 0.3x (issue 33)"),
        Result("bench/results/simulator/agentx_speed.json", f"{PY} bench/simulator/agentx_speed.py --lanes 10000 "
               "--minutes 10 --sample --baseline COMMIT",
               "simulator speed on the real AgentX traces at rack scale", headlines.sim_agentx,
               "10 simulated min at 10,000 lanes in <= 30 s wall"),
        Result("bench/results/simulator/planner_vs_dynamo.json", f"{PY} bench/simulator/planner_vs_dynamo.py",
               "issue 52's load step exported as one trace: rackserve's planner policies and every fixed P x D beside "
               "Dynamo's replay (its mocker priced by rackserve's cost model; Dynamo's planner skipped: no "
               "aisimulate), SLA attainment and GPU-hours (planner_vs_dynamo.md is generated from it)",
               lambda d: d["headline"], "record the gap"),
        Result("bench/results/simulator/frontier_point.json", f"{PY} bench/simulator/frontier_point.py --baseline "
               "COMMIT --sample", "one 900 s AgentX frontier point: CPU s and peak memory in a fresh process "
               "(bench/results/simulator/frontier_point.md is generated from it)", headlines.sim_point,
               "<= 60 CPU s at 8,192 lanes"),
        Result("bench/results/simulator/speed_bounds.json", f"{PY} bench/simulator/speed_bounds.py --lanes 2048 "
               "--minutes 3", "what bounds each of issue 33's simulator speed goals: pricing's share, calls per "
               "request against the budget (bench/results/simulator/speed_bounds.md is generated from it)",
               headlines.sim_bounds),
        Result("bench/results/simulator/cold_bounds.md", f"{PY} bench/simulator/cold_bounds.py --rounds 3",
               "what bounds issue 51's cold-run goals: each trace's cold and warm CPU by part, a step's pricing "
               "split into compiled kernels, token bundles and Python orchestration (generated from "
               "cold_bounds.json)", None),
        Result("bench/results/simulator/cython_core.json", f"{PY} bench/simulator/cython_core.py --rounds 4",
               "the simulator's hot modules compiled by Cython as they are, against pure Python", headlines.sim_compiled),
        Result("bench/results/simulator/warm_profile.md", f"{PY} bench/simulator/warm_profile.py",
               "cProfile tables of a warm Mooncake and AgentX run (pasted by hand)", None),
        Result("bench/results/simulator/step_pricing_fixes.json", f"{PY} bench/simulator/step_pricing_fixes.py "
               "--lanes 1024,4096",
               "issue 31's step-pricing fixes, before and after, on nvl72-vr200", headlines.step_pricing),
        Result("bench/results/simulator/timing_speed.json", f"{PY} bench/simulator/timing_speed.py",
               "CPU time of one step_time call of the timing model", headlines.timing_speed,
               "<= 20 us per typical decode call"),
        Result("bench/notes/timing_speed_device_host.json", f"{PY} bench/simulator/timing_speed.py (on the device host)",
               "the same on an idle 16-core host (an investigation note)", headlines.timing_device),
        Result("bench/results/simulator/lru_key_cost.json", f"{PY} bench/simulator/lru_key_cost.py",
               "one key's LRU touch and membership test on tables of growing size: the floor of a per-key KV model",
               headlines.lru),
        Result("bench/results/simulator/trace_source_cost.json", f"{PY} bench/simulator/trace_source_cost.py "
               "--lanes 2000 --duration 600", "the AgentX trace-replay source's own cost per request", headlines.trace_source),
        Result("bench/results/simulator/kv_replay.json", f"{PY} bench/simulator/kv_replay.py record, then compare "
               "--baseline DIR", "the simulator's KV calls of one AgentX run replayed on this tree and an older one",
               headlines.kv_replay),
        Result("bench/results/simulator/frontier_memo.json", f"{PY} bench/simulator/frontier_memo.py",
               "what a shared step-cost memo and a step store save a frontier search's replays", headlines.frontier_memo),
        Result("bench/results/simulator/live_vs_sim_rack.json", f"{PY} bench/simulator/live_vs_sim.py --config "
               "scenarios/nvl72-vr200.yaml --engine mock --time-scale auto --sessions 96 --rate 400 "
               "--out bench/results/simulator/live_vs_sim_rack.json",
               "the live cluster (mock ranks) against the simulator on the same arrivals, rack scale", headlines.live_vs_sim,
               "TTFT, TPOT, hit rate, rank idle within 10%"),
    )),
    Purpose("front door", "bench/frontdoor/", "What the router, gRPC, Ray and the P->D hand-off add over the engine "
            "in-process, beside Dynamo's frontend; one script, `overhead.py`, with options (`--dynamo`, "
            "`--dynamo-mode`, `--engine mock`, `--mock-ranks`, `--only dynamo|floor`).", (
        Result("bench/results/frontdoor/overhead.json", f"{PY} bench/frontdoor/overhead.py --dynamo --requests 200 "
               "(and --engine mock --mock-ranks service|actor --dynamo --dynamo-mode disagg|agg)",
               "front-door TTFT and ITL overhead, stage by stage, CPU per request by role, the bare-hop floor, "
               "and Dynamo 1.6.1's frontend + mocker under the same load", headlines.overhead,
               "TTFT overhead no more than Dynamo's"),
        Result("bench/notes/frontdoor_rank_step.json", f"{PY} bench/notes/frontdoor_rank_step.py",
               "the prefill rank's step taken apart: engine, RankWorker, actor (an investigation note)", headlines.rank_step),
        Result("bench/notes/frontdoor_ray_hop.json", f"flock /tmp/rackserve-ray.lock {PY} bench/notes/frontdoor_ray_hop.py",
               "one Ray actor call by transport (an investigation note)", headlines.ray_hop),
        Result("bench/notes/frontdoor_old_vs_new.json", "bench/frontdoor/overhead.py on two trees, alternating",
               "A/B of the front door against an older commit (an investigation note)", headlines.old_vs_new),
        Result("bench/notes/frontdoor_stages.md", "", "where the front door's TTFT goes, hop by hop, and what was "
               "tried to cut it (an investigation note)", None),
    )),
    Purpose("routing", "bench/routing/", "The router's decision and the KV events it follows.", (
        Result("bench/results/routing/decision_latency.json", f"{PY} bench/routing/decision_latency.py",
               "routing decision latency with 24 prefill ranks and ~1M indexed blocks, beside Dynamo's RadixTree",
               headlines.routing, "<= 50 us"),
        Result("bench/results/routing/event_lag.json", f"{PY} bench/routing/event_lag.py",
               "a KV event's lag from the publisher's XADD to the router's follower (the simulator's event_lag_s)",
               headlines.event_lag),
    )),
    Purpose("pool", "bench/pool/", "The KV pool: its transfer protocol against raw Redis, and (simulated) its scope "
            "under each routing policy.", (
        Result("bench/results/pool/transfer_vs_redis.json", f"{PY} bench/pool/transfer_vs_redis.py --rounds 40",
               "KV pool block put/get against raw redis-py on the same server; MatchPrefix latency", headlines.kvpool,
               "pool >= 0.8x raw"),
        Result("bench/results/pool/scope_by_policy_1536.json", f"{PY} bench/pool/scope_by_policy.py --lanes 1536 "
               "--start-s 60 --window-s 900", "pool scope {rack, instance, agentx} x routing policy on "
               "agentx-3dep2-wideep (issue 32)", headlines.scope_by_policy),
        Result("bench/results/pool/scope_by_policy_4800.json", f"{PY} bench/pool/scope_by_policy.py --lanes 4800 "
               "--start-s 60 --window-s 900", "the same at 4,800 lanes (saturated)", headlines.scope_by_policy),
        Result("bench/results/pool/capacity_sweep.json", f"{PY} bench/pool/capacity_sweep.py --lanes 1536,4800 "
               "--start-s 60 --window-s 300 (page: --render)", "pool.scope deployment: store capacity from holding "
               "everything to a tenth of the working set x routing policy on agentx-3dep2-wideep (issue 50; "
               "docs/pool-capacity.md)", headlines.capacity_sweep),
    )),
    Purpose("engine", "bench/engine/", "The numpy MoE engine and the Engram table.", (
        Result("bench/results/engine/numpy_vs_torch.json", f"{PY} bench/engine/numpy_vs_torch.py --threads 1",
               "the numpy engine's prefill and decode tokens/s against the same model in PyTorch (CPU)",
               headlines.numpy_vs_torch, ">= 0.8x everywhere"),
        Result("bench/results/engine/engram_lookup.json", f"{PY} bench/engine/engram_lookup.py --shards 4",
               "Engram batched lookup over shard processes, beside the in-process table", headlines.engram),
    )),
    Purpose("clients", "bench/clients/", "Outside load clients (AIPerf, guidellm, vllm bench serve) against the "
            "twin, and the bench client's own ceiling.", (
        Result("bench/results/clients/outside_clients.json", f"{PY} bench/clients/outside_clients.py --time-scale auto "
               "(bench/clients/guidellm.py, bench/clients/vllm_bench.py build those clients' venvs)",
               "each client's wall-clock TTFT and ITL beside the twin's simulated figures x time_scale", headlines.clients,
               "0 failures; client figures = simulated x time_scale"),
        Result("bench/results/clients/outside_clients_fast_clock.json", f"{PY} bench/clients/outside_clients.py "
               "--time-scale 0.002 --out outside_clients_fast_clock.json",
               "the same at the test suite's time_scale, where the clock cannot hold", headlines.clients),
        Result("bench/results/clients/bench_client_overhead.json", f"{PY} bench/clients/bench_client_overhead.py "
               "--url http://127.0.0.1:8000", "`rackserve bench`'s own ceiling against an instant endpoint and the "
               "cluster's rate", headlines.bench_client, "not the bottleneck"),
    )),
    Purpose("faults", "bench/faults/", "The cluster under faults, KV pressure, overload and a long soak.", (
        Result("bench/results/faults/chaos.json", f"flock /tmp/rackserve-ray.lock {PY} bench/faults/chaos.py",
               "each process killed once under load: completed, migrated, lost, time until serving again "
               "(the README's failure table)", headlines.chaos, "nothing lost"),
        Result("bench/results/faults/kv_pressure.json", f"flock /tmp/rackserve-ray.lock {PY} bench/faults/kv_pressure.py",
               "3 rounds of 64 streams as configured and with a KV-starved engine: failures, preemptions, "
               "greedy outputs", headlines.kv_pressure, "0 failed"),
        Result("bench/results/faults/overload.json", f"{PY} bench/faults/overload.py --levels 2 8 16 32",
               "N concurrent clients up to and past the admission limit: done, 429, 503, failed", headlines.overload,
               "0 failed"),
        Result("bench/results/faults/soak.json", f"{PY} bench/faults/soak.py --minutes 10 --clients 6",
               "a steady load for 10 minutes, RSS sampled each minute", headlines.soak, "0 failed, no memory growth"),
        Result("bench/notes/load_soak_gcs_cap.json", f"{PY} bench/faults/soak.py --minutes 4 --clients 6",
               "the soak after capping Ray's GCS task events (an investigation note)", headlines.soak),
    )),
)

# Results that other commands write and other pages show: named here so the page can point at them.
ELSEWHERE = (
    ("bench/results/frontier/", "rackserve sim frontier", "results.md"),
    ("bench/results/sensitivity/", "rackserve sim sensitivity", "results.md"),
    ("bench/results/validate/", "rackserve validate", "validation.md"),
)
