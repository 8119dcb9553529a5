"""Simulator speed: wall time per simulated request on the Mooncake synthetic trace, 12 DEP2
prefill instances (scenarios/dep2x12.yaml with --trace), side by side with Dynamo's offline replay
(`dynamo.replay`, run from /work/main/.venv-peers in a subprocess) on the same trace with 12
prefill + 2 decode workers. Also: the step-cost memo's error against the exact timing model.

Run: .venv/bin/python bench/sim.py [--limit N]   -> bench/results/sim.json + a printed table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rackserve.sim.run import source_factory, timing_for, with_trace
from rackserve.sim.scenario import load_scenario
from rackserve.sim.simulator import Simulator
from rackserve.timing.timing_model import TimingModel

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "data" / "mooncake_synthetic_trace.jsonl"
PEERS_PY = ROOT / ".venv-peers" / "bin" / "python"
GOAL_MS = 0.1

DYNAMO_SCRIPT = """
import json, sys, time
from dynamo.replay import run_trace_replay
def eng(w):
    return {"engine": {"block_size": 64, "num_gpu_blocks": 2_000_000, "worker_type": w}}
t = time.perf_counter()
r = run_trace_replay(sys.argv[1], num_prefill_workers=12, num_decode_workers=2, router_mode="kv_router",
                     trace_block_size=512, prefill_engine_args=eng("prefill"), decode_engine_args=eng("decode"))
wall = time.perf_counter() - t
s = r.summary
print(json.dumps({"outer_wall_s": wall, "wall_time_ms": s["wall_time_ms"], "requests": s["completed_requests"],
                  "median_ttft_ms": s["median_ttft_ms"], "prefix_cache_reused_ratio": s["prefix_cache_reused_ratio"]}))
"""


def run_ours(trace: Path, group: int, policy: str) -> dict:
    sc = with_trace(load_scenario(ROOT / "scenarios" / "dep2x12.yaml"), trace)
    sc = sc.__class__(sc.name, sc.config, sc.workload, sc.sim.model_copy(update={"kv_block_multiple": group}))
    t0 = time.perf_counter()
    make = source_factory(sc)
    load_s = time.perf_counter() - t0
    timing = timing_for(sc)
    cold = Simulator(sc, timing, policy, make()).run()
    warm = Simulator(sc, timing, policy, make()).run()  # step-cost memo already filled
    n = cold.arrivals
    return {"group_blocks": group, "policy": policy, "requests": n, "trace_load_hash_s": load_s,
            "cold_wall_s": cold.wall_s, "warm_wall_s": warm.wall_s,
            "cold_ms_per_request": cold.wall_s / n * 1e3, "warm_ms_per_request": warm.wall_s / n * 1e3,
            "cold_cpu_ms_per_request": cold.cpu_s / n * 1e3, "warm_cpu_ms_per_request": warm.cpu_s / n * 1e3,
            "events": warm.events, "timing_calls": timing.calls, "timing_misses": timing.misses,
            "hit_rate": warm.hit_rate, "ttft_p50_ms": warm.ttft_p50_s * 1e3, "tpot_p50_ms": warm.tpot_p50_s * 1e3}


def run_dynamo(trace: Path) -> dict:
    env = {**os.environ, "RUST_LOG": "error", "DYN_LOG": "error"}
    cpu0 = os.times()
    proc = subprocess.run([str(PEERS_PY), "-c", DYNAMO_SCRIPT, str(trace)], capture_output=True, text=True,
                          env=env, timeout=1800, check=True)
    cpu1 = os.times()
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["ms_per_request"] = out["wall_time_ms"] / out["requests"]
    # whole subprocess (interpreter start + trace load + replay): an upper bound on replay CPU
    out["subprocess_cpu_s"] = (cpu1.children_user - cpu0.children_user) + (cpu1.children_system - cpu0.children_system)
    out["subprocess_cpu_ms_per_request"] = out["subprocess_cpu_s"] / out["requests"] * 1e3
    return out


def memo_error(trace: Path, limit: int) -> dict:
    """Same run with the exact timing model and with the memo: relative error of TTFT / TPOT P50."""
    sc = with_trace(load_scenario(ROOT / "scenarios" / "dep2x12.yaml"), trace)
    sc = sc.with_workload(sc.workload.model_copy(update={"limit": limit}))
    make = source_factory(sc)
    exact = Simulator(sc, TimingModel.from_section(sc.config.timing), "least-uncached-work", make()).run()
    memo = Simulator(sc, timing_for(sc), "least-uncached-work", make()).run()
    return {"requests": limit, "exact_wall_s": exact.wall_s, "memo_wall_s": memo.wall_s,
            **{f"{k}_rel_err": abs(getattr(memo, k) - getattr(exact, k)) / getattr(exact, k)
               for k in ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "throughput_per_gpu")}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=None, help="first N trace records (default: all 3,993)")
    ap.add_argument("--memo-requests", type=int, default=200)
    args = ap.parse_args()
    trace = TRACE
    if args.limit:
        trace = Path("/tmp/rackserve-bench-trace.jsonl")
        trace.write_text("".join(TRACE.read_text().splitlines(keepends=True)[: args.limit]))
    ours = [run_ours(trace, g, "least-uncached-work") for g in (1, 8)]
    dynamo = run_dynamo(trace)
    memo = memo_error(trace, args.memo_requests)
    load = os.getloadavg()
    result = {"command": "python bench/sim.py" + (f" --limit {args.limit}" if args.limit else ""),
              "trace": str(TRACE), "goal_ms_per_request": GOAL_MS, "load_average_1m": load[0], "cpus": os.cpu_count(),
              "ours": ours, "dynamo_replay": dynamo,
              "ratio_ours_warm_over_dynamo": [o["warm_ms_per_request"] / dynamo["ms_per_request"] for o in ours],
              "step_memo_error": memo}
    out = ROOT / "bench" / "results" / "sim.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    table = Table(title=f"simulator speed, {ours[0]['requests']} Mooncake requests, 12 DEP2 (load avg {load[0]:.1f})")
    for col in ("run", "wall ms / req", "CPU ms / req", "wall vs Dynamo", "hit rate", "TTFT P50 ms"):
        table.add_column(col, justify="right")
    for o, ratio in zip(ours, result["ratio_ours_warm_over_dynamo"], strict=True):
        table.add_row(f"rackserve group={o['group_blocks']} cold", f"{o['cold_ms_per_request']:.3f}",
                      f"{o['cold_cpu_ms_per_request']:.3f}", "", f"{o['hit_rate']:.3f}", f"{o['ttft_p50_ms']:.1f}")
        table.add_row(f"rackserve group={o['group_blocks']} warm", f"{o['warm_ms_per_request']:.3f}",
                      f"{o['warm_cpu_ms_per_request']:.3f}", f"{ratio:.2f}x", f"{o['hit_rate']:.3f}",
                      f"{o['ttft_p50_ms']:.1f}")
    table.add_row("dynamo.replay (12P+2D)", f"{dynamo['ms_per_request']:.3f}",
                  f"<= {dynamo['subprocess_cpu_ms_per_request']:.3f}", "1.00x",
                  f"{dynamo['prefix_cache_reused_ratio']:.3f}", f"{dynamo['median_ttft_ms']:.1f}")
    Console().print(table)
    Console().print(f"step memo vs exact ({memo['requests']} requests): "
                    + ", ".join(f"{k} {v:.2%}" for k, v in memo.items() if k.endswith("rel_err")))
    print(f"goal <= {GOAL_MS} ms/request; wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
