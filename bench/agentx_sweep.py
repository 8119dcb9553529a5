"""AgentX-on-the-rack sweep, point by point in this process, saving after every point (a sweep that
runs out of time keeps what it finished): one scenario, its policies, a fixed lane grid.

    .venv/bin/python bench/agentx_sweep.py scenarios/nvl72-vr200.yaml --lanes 1,16,128,512,2048 \
        --policies least-uncached-work,dynamo-kv,round-robin --duration 120 --measure-start 30 \
        --out bench/results/agentx-rack/sweep-nvl72-vr200.json

The points of one process share the step-cost memo (rackserve.sim.sweep.shared_timing: changes no
figure, only speed). The output is a sweep file (`runs` + targets) for bench/agentx_readme.py; each
run row also records the CPU seconds it took.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rackserve.sim.sweep import GridPoint, run_point


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", type=Path)
    ap.add_argument("--lanes", required=True, help="comma-separated concurrencies, run in this order")
    ap.add_argument("--policies", default="least-uncached-work,dynamo-kv,round-robin")
    ap.add_argument("--duration", type=float, default=None, help="override the workload's duration_s")
    ap.add_argument("--measure-start", type=float, default=None, help="override measure_start_s")
    ap.add_argument("--targets", default="387,1000", help="tok/s/user to read the frontiers at")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    lanes = [int(x) for x in args.lanes.split(",")]
    policies = args.policies.split(",")
    payload = {"schema": "rackserve.sim.sweep/1", "target_tps_user": [float(t) for t in args.targets.split(",")],
               "command": f".venv/bin/python bench/agentx_sweep.py {args.scenario} --lanes {args.lanes} --policies "
                          f"{args.policies} --duration {args.duration:g} --measure-start {args.measure_start:g}",
               "runs": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for c in lanes:
        for policy in policies:
            cpu = time.process_time()
            row = run_point(GridPoint(str(args.scenario), c, policy, args.duration, args.measure_start))
            row["point_cpu_s"] = time.process_time() - cpu
            payload["runs"].append(row)
            args.out.write_text(json.dumps(payload, indent=1, default=float) + "\n")
            print(f"{row['scenario']} {policy} {c}: {row['throughput_per_gpu']:,.0f} tok/s/GPU, "
                  f"{row['user_tps_p50']:.0f} tok/s/user, TTFT P50 {row['ttft_p50_s']:.2f} s, "
                  f"{row['completed']} done, {row['point_cpu_s']:.0f} CPU s", flush=True)


if __name__ == "__main__":
    main()
