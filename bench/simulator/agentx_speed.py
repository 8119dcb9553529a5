"""Simulator speed on the real AgentX traces: N lanes for M simulated minutes of a whole-rack scenario
(issue 33's goal: 10 simulated minutes at 10,000 lanes in <= 30 s wall on this 2-core machine; issue 15 set 3 min).

Run: .venv/bin/python bench/simulator/agentx_speed.py [--lanes 10000] [--minutes 10] [--scenario scenarios/nvl72-vr200.yaml] [--sample]
         [--baseline COMMIT]
-> bench/results/simulator/agentx_speed.json (wall and CPU s, ms per simulated request and per 1,000 blocks of
prompt KV) and a printed table. --baseline: the same run on an older commit (git archive into a temp
dir, a fresh process after ours), recorded beside ours with the ratio and whether its figures equal ours.
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
from sampler import Sampler
from trees import archived, commit

from rackserve.sim.run import source_factory, timing_for
from rackserve.sim.scenario import load_scenario
from rackserve.sim.simulator import Simulator

ROOT = Path(__file__).resolve().parents[2]
GOAL_WALL_S = 30.0  # issue 33 (issue 15 set 180 s)


class Counting:
    """Wraps the arrival source to count the requests and prompt blocks it hands out."""

    def __init__(self, source) -> None:
        self.source, self.requests, self.blocks = source, 0, 0

    def _seen(self, reqs):
        self.requests += len(reqs)
        self.blocks += sum(len(r.block_hashes) for r in reqs)
        return reqs

    def start(self):
        return self._seen(self.source.start())

    def on_done(self, request, now_s):
        return self._seen(self.source.on_done(request, now_s))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "nvl72-vr200.yaml")
    ap.add_argument("--lanes", type=int, default=10_000)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--policy", default="least-uncached-work")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "simulator" / "agentx_speed.json")
    ap.add_argument("--sample", action="store_true", help="also where the CPU went (bench/simulator/sampler.py)")
    ap.add_argument("--baseline", help="an older commit to run after this tree, the same way")
    args = ap.parse_args()
    sc = load_scenario(args.scenario)
    duration = args.minutes * 60
    # the whole run from t=0, warm-up burst included (no warm-up barrier): what the speed goal times
    sc = sc.with_workload(sc.workload.model_copy(update={"concurrency": args.lanes, "duration_s": duration,
                                                          "measure_start_s": 0.0, "measure_s": None,
                                                          "warmup_first": False}))
    sampler = Sampler() if args.sample else None
    if sampler is not None:
        sampler.__enter__()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    source = Counting(source_factory(sc)())
    timing = timing_for(sc)
    res = Simulator(sc, timing, args.policy, source).run()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    if sampler is not None:
        sampler.__exit__(None, None, None)
    out = {
        "command": f".venv/bin/python bench/simulator/agentx_speed.py --lanes {args.lanes} --minutes {args.minutes:g} "
                   f"--scenario scenarios/{args.scenario.name}",
        "scenario": sc.name, "policy": args.policy, "lanes": args.lanes, "simulated_s": duration,
        "requests": source.requests, "prompt_blocks": source.blocks, "completed": res.completed,
        "wall_s": wall, "cpu_s": cpu, "sim_wall_s": res.wall_s, "sim_cpu_s": res.cpu_s,
        "ms_per_request": 1e3 * wall / max(source.requests, 1), "cpu_ms_per_request": 1e3 * cpu / max(source.requests, 1),
        "ms_per_1000_blocks": 1e6 * wall / max(source.blocks, 1), "goal_wall_s": GOAL_WALL_S,
        "meets_goal": (wall <= GOAL_WALL_S) if args.lanes >= 10_000 and args.minutes >= 10 else None,
        "step_memo_calls": timing.calls, "step_memo_misses": timing.misses,
        "throughput_per_gpu": res.throughput_per_gpu, "hit_rate": res.hit_rate,
    }
    if sampler is not None:
        out["profile"] = sampler.report()
    if args.baseline:
        out["commit"] = commit()
        out["baseline"] = run_baseline(args)
        out["ratio_wall_over_baseline"] = wall / out["baseline"]["wall_s"]
        out["baseline"]["figures_equal"] = all(out["baseline"][k] == out[k] for k in
                                               ("requests", "completed", "throughput_per_gpu", "hit_rate"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    table = Table(title=f"simulator speed: {sc.name}, {args.lanes:,} lanes, {args.minutes:g} simulated min")
    for key in ("requests", "prompt_blocks", "wall_s", "cpu_s", "ms_per_request", "cpu_ms_per_request",
                "ms_per_1000_blocks", "meets_goal"):
        v = out[key]
        table.add_row(key, f"{v:,.2f}" if isinstance(v, float) else str(v))
    Console().print(table)


def run_baseline(args: argparse.Namespace) -> dict:
    """This script's run on `args.baseline` (its rackserve first on the path), in a fresh process."""
    with archived(args.baseline, "sim-agentx-") as tree:
        result = Path(tree) / "baseline.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--scenario", str(Path(tree) / "scenarios" / args.scenario.name),
               "--lanes", str(args.lanes), "--minutes", str(args.minutes), "--policy", args.policy, "--out", str(result)]
        subprocess.run(cmd, cwd=tree, env={**os.environ, "PYTHONPATH": tree}, check=True, stdout=subprocess.DEVNULL)
        row = json.loads(result.read_text())
    keep = ("requests", "completed", "wall_s", "cpu_s", "cpu_ms_per_request", "step_memo_misses", "throughput_per_gpu",
            "hit_rate")
    return {"commit": commit(args.baseline), **{k: row[k] for k in keep}}


if __name__ == "__main__":
    main()
