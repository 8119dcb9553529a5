"""Simulator speed: wall and CPU time per simulated request on the Mooncake synthetic trace, 12 DEP2
prefill instances (scenarios/dep2x12.yaml with --trace), side by side in the same run with NVIDIA
Dynamo's offline replay (`dynamo.replay.run_trace_replay`, run in a subprocess from the separate
venv `.venv-peers` at the repository root) on the same trace with 12 prefill + 2 decode workers,
and the ratio. Also: the step-cost memo's error against the exact timing model.

Dynamo's venv (git-ignored; Dynamo 1.6.1 needs Python 3.10-3.12, e.g. 3.11):
    python3.11 -m venv .venv-peers && .venv-peers/bin/pip install ai-dynamo==1.6.1
(it pulls ai-dynamo-runtime 1.6.1). Its pinned `aisimulate==0.13.0` is a PyPI stub that fetches the
real wheel from pypi.nvidia.com; where that host is unreachable the install fails. Then install
ai-dynamo without it (its other requirements, as its 1.6.1 metadata lists them):
    .venv-peers/bin/pip install --no-deps ai-dynamo==1.6.1
    .venv-peers/bin/pip install ai-dynamo-runtime==1.6.1 'aiohttp>=3.14.3,<4' 'certifi>=2026.10.19' \
        'kubernetes>=32.0.1,<33' 'msgspec>=0.19' 'prometheus-client>=0.23.1,<1' 'pyzmq>=26' \
        'redis>=6.2,<9' tqdm 'transformers>=4.56' 'typing-extensions>=4.10' 'zstandard>=0.23,<1'
`dynamo.replay` and the frontend / mocker (bench/frontdoor_dynamo.py) import and run without it.
Without it the Dynamo row is skipped and the JSON says so.

Run: .venv/bin/python bench/sim.py [--limit N] [--repeats 3] [--baseline DIR] [--sample]
    -> bench/results/sim.json + a table.
--baseline DIR: also the same runs of an older tree (e.g. `git archive COMMIT | tar -x -C DIR`; its C
extensions are built in place first, bench/trees.py) in a subprocess with PYTHONPATH=DIR, interleaved
with ours, group by group (old vs new in one run).
Cold runs are a user's first run: a fresh process each (memo and router tables empty), `--repeats` of them,
their median; "step store filled" runs (8-block groups) are a user's later runs with `--step-store`:
fresh processes after one that filled an empty store (rackserve/sim/step_store.py), loading and saving
on the clock; Dynamo's replay runs as many times (median). --sample adds where a warm and a cold run's
CPU goes (bench/sampler.py). Warm runs (step memo and router tables filled by the cold run) are repeated and their median taken:
the machine is shared, so CPU time is reported beside wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
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


def scenario(trace: Path, group: int):
    """scenarios/dep2x12.yaml on `trace`, its KV tracked in groups of `group` blocks."""
    sc = with_trace(load_scenario(ROOT / "scenarios" / "dep2x12.yaml"), trace)
    return sc.__class__(sc.name, sc.config, sc.workload, sc.sim.model_copy(update={"kv_block_multiple": group}))


def run_ours(trace: Path, group: int, policy: str, repeats: int) -> dict:
    sc = scenario(trace, group)
    t0 = time.perf_counter()
    make = source_factory(sc)
    load_s = time.perf_counter() - t0
    timing = timing_for(sc)
    cold = Simulator(sc, timing, policy, make()).run()
    warms = [Simulator(sc, timing, policy, make()).run() for _ in range(repeats)]  # step-cost memo filled
    warm = warms[-1]
    n = cold.arrivals
    wall, cpu = statistics.median(w.wall_s for w in warms), statistics.median(w.cpu_s for w in warms)
    return {"group_blocks": group, "policy": policy, "requests": n, "trace_load_hash_s": load_s,
            "cold_wall_s": cold.wall_s, "warm_wall_s": wall, "warm_runs_wall_s": [w.wall_s for w in warms],
            "warm_runs_cpu_s": [w.cpu_s for w in warms],
            "cold_ms_per_request": cold.wall_s / n * 1e3, "warm_ms_per_request": wall / n * 1e3,
            "cold_cpu_ms_per_request": cold.cpu_s / n * 1e3, "warm_cpu_ms_per_request": cpu / n * 1e3,
            "events": warm.events, "timing_calls": timing.calls, "timing_misses": timing.misses,
            "hit_rate": warm.hit_rate, "ttft_p50_ms": warm.ttft_p50_s * 1e3, "tpot_p50_ms": warm.tpot_p50_s * 1e3}


def cold_once(trace: Path, group: int, policy: str, sample: bool = False) -> dict:
    """A user's first run: this process's first Simulator, its step-cost memo and router tables empty
    (the trace is read and hashed before the clock starts, as in run_ours)."""
    sc = scenario(trace, group)
    make = source_factory(sc)
    source = make()
    sampler = None
    if sample:
        sys.path.insert(0, str(ROOT / "bench"))
        from sampler import Sampler

        sampler = Sampler(0.002).__enter__()
    wall, cpu = time.perf_counter(), time.process_time()
    res = Simulator(sc, timing_for(sc), policy, source).run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if sampler is not None:
        sampler.__exit__(None, None, None)
    out = {"wall_s": wall, "cpu_s": cpu, "requests": res.arrivals}
    if sampler is not None:
        out["profile"] = sampler.report()
    return out


def stored_once(trace: Path, group: int, policy: str) -> dict:
    """A later run in a fresh process, with the step store ($RACKSERVE_STEP_STORE) an earlier process
    filled: reading it and saving what is new are on the clock (imported here: older trees lack it)."""
    from rackserve.sim.run import keep_steps, shared_timing

    sc = scenario(trace, group)
    source = source_factory(sc)()
    wall, cpu = time.perf_counter(), time.process_time()
    timing = shared_timing(sc)
    res = Simulator(sc, timing, policy, source).run()
    keep_steps(sc, timing)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"wall_s": wall, "cpu_s": cpu, "requests": res.arrivals, "misses": timing.misses,
            "ttft_p50_s": res.ttft_p50_s, "hit_rate": res.hit_rate}


def fresh_stored(trace: Path, group: int, policy: str, runs: int) -> dict:
    """stored_once in `runs` fresh processes after one that fills an empty store: what a user's second
    run costs with `--step-store` (rackserve/sim/step_store.py)."""
    with tempfile.TemporaryDirectory(prefix="rackserve-step-store-") as store:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "RACKSERVE_STEP_STORE": store}
        code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import sim; "
                f"print(json.dumps(sim.stored_once(sim.Path({str(trace)!r}), {group}, {policy!r})))")
        rows = [json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                          cwd=ROOT, timeout=1800, check=True).stdout.strip().splitlines()[-1])
                for _ in range(runs + 1)]
    first, timed = rows[0], rows[1:]
    ms = [1e3 * r["wall_s"] / r["requests"] for r in timed]
    return {"fresh_stored_runs_ms_per_request": ms, "fresh_stored_ms_per_request": statistics.median(ms),
            "fresh_stored_cpu_ms_per_request": statistics.median(1e3 * r["cpu_s"] / r["requests"] for r in timed),
            "fresh_stored_filling_run_ms_per_request": 1e3 * first["wall_s"] / first["requests"],
            "fresh_stored_misses": [r["misses"] for r in timed],
            "fresh_stored_figures_equal_filling_run": all((r["ttft_p50_s"], r["hit_rate"]) ==
                                                          (first["ttft_p50_s"], first["hit_rate"]) for r in timed)}


def fresh_colds(root: Path, trace: Path, group: int, policy: str, runs: int, sample: bool = False) -> dict:
    """cold_once in `runs` fresh processes on the tree at `root`: each run's ms per request, their median."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    rows = []
    for i in range(runs):
        code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import sim; "
                f"print(json.dumps(sim.cold_once(sim.Path({str(trace)!r}), {group}, {policy!r}, {sample and i == 0})))")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root,
                              timeout=1800, check=True)
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    ms = [1e3 * r["wall_s"] / r["requests"] for r in rows]
    cpu_ms = [1e3 * r["cpu_s"] / r["requests"] for r in rows]
    out = {"fresh_cold_runs_ms_per_request": ms, "fresh_cold_ms_per_request": statistics.median(ms),
           "fresh_cold_cpu_ms_per_request": statistics.median(cpu_ms)}
    if sample:
        out["fresh_cold_profile"] = rows[0]["profile"]
    return out


def sampled_warm(trace: Path, group: int, policy: str) -> dict:
    """Where a warm run's CPU goes (bench/sampler.py at 500 Hz): the memo filled by a first run."""
    sys.path.insert(0, str(ROOT / "bench"))
    from sampler import Sampler

    sc = scenario(trace, group)
    make, timing = source_factory(sc), timing_for(sc)
    Simulator(sc, timing, policy, make()).run()
    source = make()
    with Sampler(0.002) as sampler:
        Simulator(sc, timing, policy, source).run()
    return sampler.report()


def run_baseline(root: Path, trace: Path, group: int, policy: str, repeats: int) -> dict:
    """run_ours on the simulator of the tree at `root` (this script's functions, that tree's rackserve)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import sim; "
            f"print(json.dumps(sim.run_ours(sim.Path({str(trace)!r}), {group}, {policy!r}, {repeats})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root,
                          timeout=1800, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_dynamo_runs(trace: Path, runs: int) -> dict | None:
    """Dynamo's replay `runs` times (a fresh process each): the median run, with every run's ms per request."""
    rows = [run_dynamo(trace) for _ in range(runs)]
    if rows[0] is None:
        return None
    ms = [r["ms_per_request"] for r in rows]  # type: ignore[index]
    mid = sorted(rows, key=lambda r: r["ms_per_request"])[len(rows) // 2]  # type: ignore[index]
    return {**mid, "runs_ms_per_request": ms, "ms_per_request": statistics.median(ms)}  # type: ignore[dict-item]


def run_dynamo(trace: Path) -> dict | None:
    if not PEERS_PY.exists():
        print(f"no {PEERS_PY}: Dynamo's replay skipped (see this script's docstring)", file=sys.stderr)
        return None
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


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=None, help="first N trace records (default: all 3,993)")
    ap.add_argument("--memo-requests", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3, help="warm runs per configuration (median)")
    ap.add_argument("--baseline", type=Path, default=None, help="an older tree to run beside ours (see the docstring)")
    ap.add_argument("--sample", action="store_true", help="also profile a warm and a fresh cold run (bench/sampler.py)")
    args = ap.parse_args()
    trace = TRACE
    if args.limit:
        trace = Path("/tmp/rackserve-bench-trace.jsonl")
        trace.write_text("".join(TRACE.read_text().splitlines(keepends=True)[: args.limit]))
    ours, base = [], []
    policy = "least-uncached-work"
    if args.baseline is not None:
        sys.path.insert(0, str(ROOT / "bench"))
        from trees import built

        built(args.baseline)
    for g in (1, 8):  # interleaved, so both sides see the same load
        if args.baseline is not None:
            base.append({**run_baseline(args.baseline, trace, g, policy, args.repeats),
                         **fresh_colds(args.baseline, trace, g, policy, args.repeats)})
        ours.append({**run_ours(trace, g, policy, args.repeats),
                     **fresh_colds(ROOT, trace, g, policy, args.repeats, args.sample and g == 8),
                     **(fresh_stored(trace, g, policy, args.repeats) if g == 8 else {})})
    if args.sample:
        ours[-1]["warm_profile"] = sampled_warm(trace, 8, policy)
    dynamo = run_dynamo_runs(trace, args.repeats)
    memo = memo_error(trace, args.memo_requests)
    load = os.getloadavg()
    result = {"command": "python bench/sim.py" + (f" --limit {args.limit}" if args.limit else "")
              + (f" --repeats {args.repeats}" if args.repeats != 3 else "")
              + (f" --baseline {args.baseline}" if args.baseline else "")
              + (" --sample" if args.sample else ""), "commit": _commit(),
              "trace": str(TRACE), "goal_ms_per_request": GOAL_MS, "load_average_1m": load[0], "cpus": os.cpu_count(),
              "ours": ours, "dynamo_replay": dynamo,
              "ratio_ours_warm_over_dynamo": [o["warm_ms_per_request"] / dynamo["ms_per_request"] for o in ours]
              if dynamo else None,
              "ratio_ours_fresh_cold_over_dynamo": [o["fresh_cold_ms_per_request"] / dynamo["ms_per_request"]
                                                    for o in ours] if dynamo else None,
              "ratio_ours_fresh_stored_over_dynamo": ours[-1]["fresh_stored_ms_per_request"] / dynamo["ms_per_request"]
              if dynamo else None,
              "goal": "medians of 3, ours beside Dynamo in one run: warm <= 0.1x, cold (a fresh process) <= 0.3x",
              "step_memo_error": memo}
    if base:
        result["baseline"] = {"root": str(args.baseline), "runs": base,
                              "ratio_ours_warm_over_baseline": [o["warm_ms_per_request"] / b["warm_ms_per_request"]
                                                                for o, b in zip(ours, base, strict=True)],
                              "ratio_ours_warm_cpu_over_baseline": [
                                  o["warm_cpu_ms_per_request"] / b["warm_cpu_ms_per_request"]
                                  for o, b in zip(ours, base, strict=True)]}
    out = ROOT / "bench" / "results" / "sim.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    table = Table(title=f"simulator speed, {ours[0]['requests']} Mooncake requests, 12 DEP2 (load avg {load[0]:.1f})")
    for col in ("run", "wall ms / req", "CPU ms / req", "wall vs Dynamo", "hit rate", "TTFT P50 ms"):
        table.add_column(col, justify="right")
    for o, ratio in zip(ours, result["ratio_ours_warm_over_dynamo"] or [float("nan")] * len(ours), strict=True):
        cold_ratio = o["fresh_cold_ms_per_request"] / dynamo["ms_per_request"] if dynamo else float("nan")
        table.add_row(f"rackserve group={o['group_blocks']} cold (fresh process)",
                      f"{o['fresh_cold_ms_per_request']:.3f}", f"{o['fresh_cold_cpu_ms_per_request']:.3f}",
                      f"{cold_ratio:.2f}x", f"{o['hit_rate']:.3f}", f"{o['ttft_p50_ms']:.1f}")
        if "fresh_stored_ms_per_request" in o:
            table.add_row(f"rackserve group={o['group_blocks']} fresh process, step store filled",
                          f"{o['fresh_stored_ms_per_request']:.3f}", f"{o['fresh_stored_cpu_ms_per_request']:.3f}",
                          f"{o['fresh_stored_ms_per_request'] / dynamo['ms_per_request']:.2f}x" if dynamo else "",
                          f"{o['hit_rate']:.3f}", f"{o['ttft_p50_ms']:.1f}")
        table.add_row(f"rackserve group={o['group_blocks']} warm", f"{o['warm_ms_per_request']:.3f}",
                      f"{o['warm_cpu_ms_per_request']:.3f}", f"{ratio:.2f}x", f"{o['hit_rate']:.3f}",
                      f"{o['ttft_p50_ms']:.1f}")
    for b in base:
        table.add_row(f"baseline group={b['group_blocks']} warm", f"{b['warm_ms_per_request']:.3f}",
                      f"{b['warm_cpu_ms_per_request']:.3f}",
                      f"{b['warm_ms_per_request'] / dynamo['ms_per_request']:.2f}x" if dynamo else "",
                      f"{b['hit_rate']:.3f}", f"{b['ttft_p50_ms']:.1f}")
    if dynamo:
        table.add_row("dynamo.replay (12P+2D)", f"{dynamo['ms_per_request']:.3f}",
                      f"<= {dynamo['subprocess_cpu_ms_per_request']:.3f}", "1.00x",
                      f"{dynamo['prefix_cache_reused_ratio']:.3f}", f"{dynamo['median_ttft_ms']:.1f}")
    Console().print(table)
    Console().print(f"step memo vs exact ({memo['requests']} requests): "
                    + ", ".join(f"{k} {v:.2%}" for k, v in memo.items() if k.endswith("rel_err")))
    print(f"goal <= {GOAL_MS} ms/request; wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
