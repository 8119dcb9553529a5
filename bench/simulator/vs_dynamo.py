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

Run: .venv/bin/python bench/simulator/vs_dynamo.py [--rounds 3] [--traces mooncake,agentx] [--group 8] [--memo-requests 200] [--twins]
    -> bench/results/simulator/vs_dynamo.json + a table. --twins: a third side, ours priced by the numpy twins of the compiled
    step pricer (KERNELS of rackserve/timing/step_plan.py, step_assemble.py, step_cost.py), rotating with the other two.
Fair timing (issue 51): per trace (the Mooncake one and bench/simulator/agentx_as_mooncake.py's AgentX conversations as a
Mooncake trace), `--rounds` rounds of ours in a fresh process (its first run cold: step memo and router tables
empty; then a second, warm run in the same process) and Dynamo's replay in a fresh process, the side that goes
first alternating, CPU time (each side's process CPU around its run; Dynamo's includes its Rust threads) and wall,
medians of the rounds, the load average after every run. The other functions (run_ours, fresh_colds,
fresh_stored, run_baseline, sampled_warm) are what bench/simulator/cython_core.py and older commands use.
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

import agentx_as_mooncake
from rich.console import Console
from rich.table import Table

from rackserve.sim.run import source_factory, timing_for, with_trace
from rackserve.sim.scenario import load_scenario
from rackserve.sim.simulator import Simulator
from rackserve.timing.timing_model import TimingModel

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "data" / "mooncake_synthetic_trace.jsonl"
PEERS_PY = ROOT / ".venv-peers" / "bin" / "python"
GOAL_MS = 0.1

DYNAMO_SCRIPT = """
import json, sys, time
from dynamo.replay import run_trace_replay
def eng(w):
    return {"engine": {"block_size": 64, "num_gpu_blocks": 2_000_000, "worker_type": w}}
t, c = time.perf_counter(), time.process_time()
r = run_trace_replay(sys.argv[1], num_prefill_workers=12, num_decode_workers=2, router_mode="kv_router",
                     trace_block_size=512, prefill_engine_args=eng("prefill"), decode_engine_args=eng("decode"))
wall, cpu = time.perf_counter() - t, time.process_time() - c
s = r.summary
print(json.dumps({"outer_wall_s": wall, "cpu_s": cpu, "wall_time_ms": s["wall_time_ms"], "requests": s["completed_requests"],
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
        sys.path.insert(0, str(ROOT / "bench" / "simulator"))
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
        code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'bench' / 'simulator')!r}); import vs_dynamo; "
                f"print(json.dumps(vs_dynamo.stored_once(vs_dynamo.Path({str(trace)!r}), {group}, {policy!r})))")
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
        code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'bench' / 'simulator')!r}); import vs_dynamo; "
                f"print(json.dumps(vs_dynamo.cold_once(vs_dynamo.Path({str(trace)!r}), {group}, {policy!r}, {sample and i == 0})))")
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
    """Where a warm run's CPU goes (bench/simulator/sampler.py at 500 Hz): the memo filled by a first run."""
    sys.path.insert(0, str(ROOT / "bench" / "simulator"))
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
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'bench' / 'simulator')!r}); import vs_dynamo; "
            f"print(json.dumps(vs_dynamo.run_ours(vs_dynamo.Path({str(trace)!r}), {group}, {policy!r}, {repeats})))")
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
    out["wall_ms_per_request"] = out["ms_per_request"]
    out["cpu_ms_per_request"] = 1e3 * out["cpu_s"] / out["requests"]
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


def use_twins() -> None:
    """This process prices steps with the numpy twins of the compiled kernels (KERNELS of rackserve/timing/
    step_plan.py, step_assemble.py and step_cost.py's token bundles): what an install without a C compiler runs,
    and the pricing before issue 51."""
    from rackserve.timing import step_assemble, step_cost, step_plan

    for module in (step_plan, step_assemble, step_cost):
        for name, (twin, _) in module.KERNELS.items():
            setattr(module, name, twin)


def cold_then_warm(trace: Path, group: int, policy: str, twins: bool = False) -> dict:
    """A user's first run in this (fresh) process, then a second run of the same trace in it (the step
    memo and router tables filled: warm). The trace is read and hashed before each clock starts.
    `twins`: priced by the numpy twins (use_twins)."""
    if twins:
        use_twins()
    sc = scenario(trace, group)
    make, timing = source_factory(sc), timing_for(sc)
    out: dict = {}
    for which in ("cold", "warm"):
        source = make()
        wall, cpu = time.perf_counter(), time.process_time()
        res = Simulator(sc, timing, policy, source).run()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        out[which] = {"wall_s": wall, "cpu_s": cpu, "wall_ms_per_request": 1e3 * wall / res.arrivals,
                      "cpu_ms_per_request": 1e3 * cpu / res.arrivals}
    out.update(requests=res.arrivals, step_memo_misses=timing.misses, hit_rate=res.hit_rate,
               ttft_p50_ms=res.ttft_p50_s * 1e3)
    return out


def fresh_ours(root: Path, trace: Path, group: int, policy: str, twins: bool = False) -> dict:
    """cold_then_warm in a fresh process on the tree at `root`."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("RACKSERVE_STEP_STORE", None)
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'bench' / 'simulator')!r}); import vs_dynamo; "
            f"print(json.dumps(vs_dynamo.cold_then_warm(vs_dynamo.Path({str(trace)!r}), {group}, {policy!r}, {twins})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root,
                          timeout=1800, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def interleaved(trace: Path, group: int, policy: str, rounds: int, twins: bool = False) -> dict:
    """`rounds` rounds of ours (a fresh process: cold, then warm) and Dynamo's replay (a fresh process),
    the side that goes first rotating, each run's load average beside it; medians of the rounds. `twins`:
    also ours priced by the numpy twins (use_twins) in a fresh process of its own, a third side."""
    sides = ["ours", "dynamo"] + (["ours_numpy_twins"] if twins else [])
    run = {"ours": lambda: fresh_ours(ROOT, trace, group, policy), "dynamo": lambda: run_dynamo(trace),
           "ours_numpy_twins": lambda: fresh_ours(ROOT, trace, group, policy, twins=True)}
    rows = []
    for i in range(rounds):
        row: dict = {"round": i}
        for side in sides[i % len(sides):] + sides[:i % len(sides)]:
            row[side] = run[side]()
            row[f"load_average_1m_after_{side}"] = os.getloadavg()[0]
        rows.append(row)
    med = statistics.median

    def medians(side: str) -> dict:
        return {f"{which}_{kind}_ms_per_request": med(r[side][which][f"{kind}_ms_per_request"] for r in rows)
                for which in ("cold", "warm") for kind in ("cpu", "wall")}

    ours = medians("ours")
    out = {"trace": str(trace), "requests": rows[0]["ours"]["requests"], "rounds": rows, "ours": ours,
           "load_average_1m": [r[k] for r in rows for k in r if k.startswith("load_average")]}
    if twins:
        out["ours_numpy_twins"] = medians("ours_numpy_twins")
        out["compiled_over_twins"] = {k: ours[k] / out["ours_numpy_twins"][k] for k in ours}
    if rows[0]["dynamo"] is None:
        out["dynamo"] = None
        return out
    out["dynamo"] = {f"{kind}_ms_per_request": med(r["dynamo"][f"{kind}_ms_per_request"] for r in rows)
                     for kind in ("cpu", "wall")}
    out["ratios"] = {f"{which}_{kind}": ours[f"{which}_{kind}_ms_per_request"] / out["dynamo"][f"{kind}_ms_per_request"]
                     for which in ("cold", "warm") for kind in ("cpu", "wall")}
    return out


TRACES = {"mooncake": lambda: TRACE, "agentx": lambda: agentx_as_mooncake.write()}
# issue 51's goals: ours over Dynamo's replay, CPU per simulated request, cold run (a fresh process)
COLD_GOAL_X = {"mooncake": 1.0, "agentx": 0.5}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per trace (medians)")
    ap.add_argument("--traces", default="mooncake,agentx")
    ap.add_argument("--group", type=int, default=8, help="kv_block_multiple of ours (8: the headline)")
    ap.add_argument("--memo-requests", type=int, default=200, help="requests of the step memo's error check (0: none)")
    ap.add_argument("--twins", action="store_true", help="also ours priced by the numpy twins (a third side)")
    args = ap.parse_args()
    policy = "least-uncached-work"
    names = args.traces.split(",")
    traces = {name: interleaved(TRACES[name](), args.group, policy, args.rounds, args.twins) for name in names}
    load = os.getloadavg()
    result = {"command": f"python bench/simulator/vs_dynamo.py --rounds {args.rounds} --traces {args.traces} --group {args.group}"
                         + (" --twins" if args.twins else ""),
              "commit": _commit(), "cpus": os.cpu_count(), "load_average_1m_at_end": load[0],
              "protocol": "per trace, rounds of ours (a fresh process: its first run cold, then a warm run) and "
                          "Dynamo's replay (a fresh process), alternating which goes first; medians of the rounds; "
                          "CPU is each side's process CPU around the run (Dynamo's: its replay call, threads "
                          "included), wall its wall time",
              "goal": {"cold_cpu_over_dynamo": COLD_GOAL_X, "warm": "no worse than before issue 51"},
              "peer": "dynamo.replay.run_trace_replay (NVIDIA Dynamo 1.6.1), 12 prefill + 2 decode workers, kv_router",
              "traces": traces}
    if not PEERS_PY.exists():
        result["peer_missing"] = f"{PEERS_PY.relative_to(ROOT)} not found: Dynamo's runs skipped (this docstring)"
    if "mooncake" in names and args.memo_requests:
        result["step_memo_error"] = memo_error(TRACE, args.memo_requests)
    out = ROOT / "bench" / "results" / "simulator" / "vs_dynamo.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    table = Table(title=f"simulator speed, ours vs Dynamo's replay, fresh processes interleaved, medians of "
                        f"{args.rounds} (load avg {min(min(t['load_average_1m']) for t in traces.values()):.1f}-"
                        f"{max(max(t['load_average_1m']) for t in traces.values()):.1f})")
    for col in ("trace", "requests", "cold CPU ms/req", "warm CPU ms/req", "Dynamo CPU ms/req", "cold / Dynamo",
                "warm / Dynamo", "cold wall", "warm wall", "Dynamo wall"):
        table.add_column(col, justify="right")
    for name, t in traces.items():
        o, d, r = t["ours"], t["dynamo"], t.get("ratios", {})
        table.add_row(name, f"{t['requests']:,}", f"{o['cold_cpu_ms_per_request']:.3f}", f"{o['warm_cpu_ms_per_request']:.3f}",
                      f"{d['cpu_ms_per_request']:.3f}" if d else "-", f"{r['cold_cpu']:.2f}x" if d else "-",
                      f"{r['warm_cpu']:.2f}x" if d else "-", f"{o['cold_wall_ms_per_request']:.3f}",
                      f"{o['warm_wall_ms_per_request']:.3f}", f"{d['wall_ms_per_request']:.3f}" if d else "-")
    for name, t in traces.items():
        if "ours_numpy_twins" in t:
            o = t["ours_numpy_twins"]
            table.add_row(f"{name}, numpy twins", f"{t['requests']:,}", f"{o['cold_cpu_ms_per_request']:.3f}",
                          f"{o['warm_cpu_ms_per_request']:.3f}", "", "", "", f"{o['cold_wall_ms_per_request']:.3f}",
                          f"{o['warm_wall_ms_per_request']:.3f}", "")
    Console(width=160).print(table)
    if "peer_missing" in result:
        print(result["peer_missing"], file=sys.stderr)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
