"""Where the simulator's time goes: cProfile of one warm run (step-cost memo and router tables
already filled by a first run) of the Mooncake trace on dep2x12 (bench/simulator/vs_dynamo.py's run) and of the
AgentX traces on nvl72-vr200 (bench/simulator/agentx_speed.py's run), top functions by self and cumulative time.

Run: .venv/bin/python bench/simulator/warm_profile.py [--group 8] [--lanes 2000] [--minutes 2] [--top 25] [--which mooncake,agentx]
-> prints the tables (paste them into bench/results/simulator/warm_profile.md).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from pathlib import Path

from rackserve.sim.run import source_factory, timing_for, with_trace
from rackserve.sim.scenario import load_scenario
from rackserve.sim.simulator import Simulator

ROOT = Path(__file__).resolve().parents[2]


def _mooncake(args):
    sc = with_trace(load_scenario(ROOT / "scenarios" / "dep2x12.yaml"), ROOT / "data" / "mooncake_synthetic_trace.jsonl")
    return sc.__class__(sc.name, sc.config, sc.workload, sc.sim.model_copy(update={"kv_block_multiple": args.group}))


def _agentx(args):
    sc = load_scenario(ROOT / "scenarios" / "nvl72-vr200.yaml")
    return sc.with_workload(sc.workload.model_copy(update={
        "concurrency": args.lanes, "duration_s": args.minutes * 60, "measure_start_s": 0.0, "measure_s": None}))


def profile(name: str, sc, top: int) -> None:
    make, timing = source_factory(sc), timing_for(sc)
    Simulator(sc, timing, "least-uncached-work", make()).run()  # cold: fills the memo and tables
    source = make()
    prof = cProfile.Profile()
    wall, cpu = time.perf_counter(), time.process_time()
    prof.enable()
    res = Simulator(sc, timing, "least-uncached-work", source).run()
    prof.disable()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    n = max(res.arrivals + res.warmup_requests, 1)
    print(f"\n## {name}: {n} requests, {res.events} events, wall {wall:.2f} s (profiled), CPU {cpu:.2f} s, "
          f"{1e3 * cpu / n:.3f} CPU ms per request")
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(key).print_stats(top)
        lines = buf.getvalue().splitlines()
        start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls"))
        print(f"\n### by {key}\n```")
        print("\n".join(lines[start:]).rstrip())
        print("```")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", type=int, default=2000)
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--group", type=int, default=8, help="Mooncake: kv_block_multiple (bench/simulator/vs_dynamo.py's headline: 8)")
    ap.add_argument("--which", default="mooncake,agentx")
    args = ap.parse_args()
    for name in args.which.split(","):
        sc = {"mooncake": _mooncake, "agentx": _agentx}[name](args)
        profile(name, sc, args.top)


if __name__ == "__main__":
    main()
