"""One 900 s AgentX point, as the frontier search replays it: its CPU seconds and peak memory in a fresh
process (step-cost memo empty), this tree beside an older commit in the same run (issue 33's goal: the point
at 8,192 lanes on nvl72-vr200 in <= 60 CPU s). With --sample, where the CPU went (bench/sampler.py).

Run: .venv/bin/python bench/sim_point.py [--lanes 8192] [--scenario scenarios/nvl72-vr200.yaml]
         [--baseline COMMIT] [--sample] [--serial]
-> bench/results/sim_point.json: a list of rows {"scenario", "policy", "lanes", "window_s", "cpu_s",
   "max_rss_gb", "commit", ...}, this run's rows replacing earlier rows of the same commit and lanes.
The two trees run at once, one per core (--serial: one after the other), so they share the machine's state.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "sim_point.json"


def child(scenario: str, lanes: int, sample: bool) -> None:
    """The point in this process, whichever rackserve PYTHONPATH gives; one JSON line on stdout."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sampler import Sampler

    from rackserve.sim.run import simulate, with_concurrency
    from rackserve.sim.scenario import load_scenario

    cpu0, wall0 = time.process_time(), time.perf_counter()
    sampler = Sampler() if sample else None
    if sampler:
        sampler.__enter__()
    sc = with_concurrency(load_scenario(scenario), lanes)
    res = simulate(sc)
    if sampler:
        sampler.__exit__(None, None, None)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    d = res.to_dict()
    requests = d.get("arrivals", 0) + d.get("warmup_requests", 0)
    window = getattr(sc.workload, "measure_window", None)
    row = {"scenario": sc.name, "policy": sc.config.routing.policy, "lanes": lanes,
           "window_s": None if window is None else float(window[1] - window[0]),
           "cpu_s": round(cpu, 2), "wall_s": round(wall, 2),
           "max_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 3),
           "requests": requests, "cpu_ms_per_request": round(1e3 * cpu / max(requests, 1), 4),
           "completed": d.get("completed"), "throughput_per_gpu": d.get("throughput_per_gpu"),
           "tps_user_e2e_p90": d.get("tps_user_e2e_p90"), "ttft_p90_s": d.get("ttft_p90_s"),
           "hit_rate": d.get("hit_rate"), "events": d.get("events")}
    if sampler:
        row["profile"] = sampler.report()
    print(json.dumps(row))


def _commit(ref: str = "HEAD") -> str:
    out = subprocess.run(["git", "rev-parse", "--short", ref], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _start(tree: Path | None, scenario: str, lanes: int, sample: bool) -> subprocess.Popen:
    env = {**os.environ}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    cmd = [sys.executable, str(Path(__file__).resolve()), "_child", scenario, str(lanes), "1" if sample else "0"]
    return subprocess.Popen(cmd, env=env, cwd=tree or ROOT, stdout=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"point run failed (exit {proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1")
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="scenarios/nvl72-vr200.yaml")
    ap.add_argument("--lanes", type=int, default=8192)
    ap.add_argument("--baseline", help="an older commit to run beside this tree (git archive into a temp dir)")
    ap.add_argument("--sample", action="store_true", help="profile this tree's run (bench/sampler.py)")
    ap.add_argument("--serial", action="store_true", help="run the trees one after the other")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "rackserve"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    mine = _commit() + (" + uncommitted changes" if dirty else "")
    runs: list[tuple[str, Path | None]] = [(mine, None)]
    tmp = None
    if args.baseline:
        tmp = tempfile.TemporaryDirectory(prefix="sim-point-")
        archive = subprocess.run(["git", "archive", args.baseline], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp.name], input=archive.stdout, check=True)
        runs.append((_commit(args.baseline), Path(tmp.name)))
    load = os.getloadavg()[0]
    rows = []
    if args.serial:
        for commit, tree in runs:
            rows.append({**_finish(_start(tree, args.scenario, args.lanes, args.sample and tree is None)),
                         "commit": commit})
    else:
        procs = [(commit, _start(tree, args.scenario, args.lanes, args.sample and tree is None))
                 for commit, tree in runs]
        rows = [{**_finish(p), "commit": commit} for commit, p in procs]
    if tmp is not None:
        tmp.cleanup()
    note = (f"fresh process per tree (memo empty), {'one after the other' if args.serial else 'both at once, one per core'}"
            f"; load {load:.2f} at the start")
    for row in rows:
        row["note"] = note
    old = json.loads(args.out.read_text()) if args.out.exists() else []
    keep = [r for r in old if (r.get("commit"), r.get("lanes")) not in {(r2["commit"], r2["lanes"]) for r2 in rows}]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(keep + rows, indent=2) + "\n")
    for row in rows:
        print(f"{row['commit']:>28}: {row['lanes']:,} lanes, {row['window_s']} s window: {row['cpu_s']:.1f} CPU s, "
              f"{row['cpu_ms_per_request']:.3f} ms/request, {row['max_rss_gb']:.2f} GB max RSS")
    if len(rows) == 2:
        print(f"ratio (this tree / baseline): {rows[0]['cpu_s'] / rows[1]['cpu_s']:.3f}x CPU")


if __name__ == "__main__":
    main()
