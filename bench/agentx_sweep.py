"""AgentX-on-the-rack sweep, point by point in this process, saving after every point (a sweep that
runs out of time keeps what it finished): one scenario, its policies, a fixed lane grid.

    .venv/bin/python bench/agentx_sweep.py scenarios/nvl72-vr200.yaml --lanes 1,16,128,512,2048 \
        --policies least-uncached-work,dynamo-kv,round-robin --duration 90 --measure-start 30 \
        --out bench/results/agentx-rack/sweep-nvl72-vr200.json

Without --duration / --measure-start a point uses the scenario's own window (AgentX's: 60 s start,
900 s length). The points of one process share the step-cost memo (rackserve.sim.sweep.shared_timing:
changes no figure, only speed). The output is a sweep file (`runs` + targets) for
bench/agentx_readme.py; each run row also records the code commit it ran on, its measured window
(measure_start_s, window_s) and the CPU seconds it took. --stop-by HH:MM (UTC) skips the points
that would end after it, judged by the previous point's wall time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import time
from pathlib import Path

from rackserve.sim.scenario import load_scenario
from rackserve.sim.sweep import GridPoint, run_point


def code_commit() -> str:
    """The short commit this tree is at, '+dirty' when tracked files differ from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "rackserve"], capture_output=True).returncode
    return head + ("+dirty" if dirty else "")


def window(scenario: Path, duration_s: float | None, measure_start_s: float | None) -> dict:
    """The measured window a point gets (by arrival): the overrides, else the scenario's own fields."""
    wl = load_scenario(str(scenario)).workload
    update = {k: v for k, v in (("duration_s", duration_s), ("measure_start_s", measure_start_s)) if v is not None}
    wl = wl.model_copy(update=update)
    start, end = wl.measure_window if hasattr(wl, "measure_window") else (0.0, wl.duration_s)
    return {"measure_start_s": start, "window_s": end - start, "duration_s": wl.duration_s,
            "warmup_first": bool(getattr(wl, "warmup_first", False))}


def _opt(name: str, v: float | None) -> str:
    return "" if v is None else f" {name} {v:g}"


def past(stop_by: str | None, seconds: float) -> bool:
    """Whether now + seconds is after HH:MM UTC today."""
    if not stop_by:
        return False
    now = dt.datetime.now(dt.UTC)
    h, m = (int(x) for x in stop_by.split(":"))
    return now + dt.timedelta(seconds=seconds) > now.replace(hour=h, minute=m, second=0, microsecond=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", type=Path)
    ap.add_argument("--lanes", required=True, help="comma-separated concurrencies, run in this order")
    ap.add_argument("--policies", default="least-uncached-work,dynamo-kv,round-robin")
    ap.add_argument("--duration", type=float, default=None, help="override the workload's duration_s")
    ap.add_argument("--measure-start", type=float, default=None, help="override measure_start_s")
    ap.add_argument("--targets", default="387,1000", help="tok/s/user to read the frontiers at")
    ap.add_argument("--stop-by", default=None, help="HH:MM UTC: skip points the previous one says end later")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    lanes = [int(x) for x in args.lanes.split(",")]
    policies = args.policies.split(",")
    code, win = code_commit(), window(args.scenario, args.duration, args.measure_start)
    payload = {"schema": "rackserve.sim.sweep/1", "target_tps_user": [float(t) for t in args.targets.split(",")],
               "command": f".venv/bin/python bench/agentx_sweep.py {args.scenario} --lanes {args.lanes} --policies "
                          f"{args.policies}{_opt('--duration', args.duration)}"
                          f"{_opt('--measure-start', args.measure_start)}",
               "code": code, "window": win, "runs": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    last_wall = 0.0
    for c in lanes:
        for policy in policies:
            if past(args.stop_by, last_wall):
                print(f"skipped {policy} {c}: the previous point took {last_wall:.0f} s wall, past {args.stop_by}")
                continue
            cpu, wall = time.process_time(), time.monotonic()
            row = run_point(GridPoint(str(args.scenario), c, policy, args.duration, args.measure_start))
            row.update(code=code, **win, point_cpu_s=time.process_time() - cpu)
            last_wall = time.monotonic() - wall
            payload["runs"].append(row)
            args.out.write_text(json.dumps(payload, indent=1, default=float) + "\n")
            print(f"{row['scenario']} {policy} {c}: {row['throughput_per_gpu']:,.0f} tok/s/GPU, "
                  f"{row['user_tps_p50']:.0f} tok/s/user, TTFT P50 {row['ttft_p50_s']:.2f} s, "
                  f"{row['completed']} done, {row['point_cpu_s']:.0f} CPU s, {last_wall:.0f} s wall", flush=True)


if __name__ == "__main__":
    main()
