"""Issue 50's sweep on agentx-3dep2-wideep with `pool.scope: deployment` (a Mooncake store over the
deployment's 6 trays): per lane count, the store first holds everything (each host's whole DRAM as
its segment), then a half, a quarter and a tenth of the working set that run measured (segment =
fraction x working set / hosts); for least-uncached-work, dynamo-kv and round-robin: requests
completed, TTFT P50/P90, hit rate by tier, evictions, lockstep idle and idle while work waits.

    .venv/bin/python bench/pool/capacity_sweep.py --lanes 1536,4800 [--window-s 300 --start-s 60]
        -> bench/results/pool/capacity_sweep.json (rewritten after every run; one run at a time)
    .venv/bin/python bench/pool/capacity_sweep.py --render
        -> bench/results/pool/capacity_sweep.png and docs/pool-capacity.md, from the JSON alone
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: `bench.pool`
from bench.pool.capacity_render import render  # noqa: E402
from rackserve.sim.pool_scope import deployment_hosts  # noqa: E402
from rackserve.sim.run import simulate, timing_for  # noqa: E402
from rackserve.sim.scenario import scenario_from_dict  # noqa: E402
from rackserve.sim.sizing import size_scenario  # noqa: E402
from rackserve.timing.spec import load_hardware  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "results" / "pool" / "capacity_sweep.json"
PLOT = ROOT / "bench" / "results" / "pool" / "capacity_sweep.png"
PAGE = ROOT / "docs" / "pool-capacity.md"
POLICIES = ("least-uncached-work", "dynamo-kv", "round-robin")
FRACTIONS = (0.5, 0.25, 0.1)  # of the working set the "holds everything" run measured
KEEP = ("completed", "arrivals", "rejected", "ttft_p50_s", "ttft_p90_s", "hit_rate", "hit_rate_by_tier",
        "evictions", "recomputed_tokens", "prefill_idle_frac", "prefill_idle_waiting_frac", "prefill_empty_frac",
        "decode_idle_waiting_frac", "decode_empty_frac", "prefill_util", "pool_capacity_bytes", "pool_occupancy",
        "throughput_per_gpu", "cpu_s")


def base(lanes: int, start_s: float, window_s: float) -> dict:
    data = yaml.safe_load((ROOT / "scenarios" / "agentx-3dep2-wideep.yaml").read_text())
    data["workload"].update(concurrency=lanes, measure_start_s=start_s, duration_s=start_s + window_s)
    return data


def hosts_of(data: dict) -> tuple[int, float]:
    """(hosts the deployment occupies, one host's DRAM bytes)."""
    sc = scenario_from_dict(data)
    hw = load_hardware(sc.config.timing.hardware)
    dep = sc.config.deployment
    per = lambda groups: [g.gpus for g in groups for _ in range(g.count)]  # noqa: E731
    return len(deployment_hosts(per(dep.prefill), per(dep.decode), hw.gpus_per_tray)), hw.host_dram_bytes_per_tray


def recipe_store_bytes(data: dict) -> float:
    """The store vLLM's MooncakeStoreConnector recipe gives this deployment (segment unset)."""
    return size_scenario(scenario_from_dict({**data, "pool": {"scope": "deployment"}})).pool_dram.capacity_bytes


def run_one(data: dict, segment: int, policy: str, timing) -> tuple[dict, object]:
    data = {**data, "pool": {"scope": "deployment", "segment_bytes_per_host": segment}}
    sc = scenario_from_dict(data, name="agentx-3dep2-wideep/deployment")
    timing = timing or timing_for(sc)
    res = simulate(sc, policy=policy, timing=timing).to_dict()
    row = {k: res[k] for k in KEEP}
    trace = res["pool_trace"]
    row["pool_trace"] = {k: trace[k] for k in ("t_s", "working_set_bytes", "held_bytes")}
    row["working_set_bytes"] = trace["working_set_bytes"][-1]
    return row, timing


def sweep(args) -> None:
    doc = json.loads(OUT.read_text()) if OUT.exists() and args.resume else {"rows": []}
    done = {(r["lanes"], r["capacity"], r["policy"]) for r in doc["rows"]}
    doc.update(scenario="scenarios/agentx-3dep2-wideep.yaml", pool_scope="deployment", measure_start_s=args.start_s,
               window_s=args.window_s, note="SHORT window, not AgentX's 900 s" if args.window_s < 900 else "AgentX's 900 s",
               command=f"python bench/pool/capacity_sweep.py --lanes {args.lanes} --start-s {args.start_s:g} "
                       f"--window-s {args.window_s:g}")
    doc["recipe_store_bytes"] = recipe_store_bytes(base(1, args.start_s, args.window_s))
    timing = None
    lanes_list = [int(x) for x in args.lanes.split(",")]
    setups = {lanes: (base(lanes, args.start_s, args.window_s), *hosts_of(base(lanes, args.start_s, args.window_s)))
              for lanes in lanes_list}
    # every lane count holding everything first, then the smallest store, so a cut-short sweep has both ends
    for lanes, (data, hosts, host_dram) in setups.items():
        for policy in POLICIES:
            timing = _run(doc, done, data, lanes, hosts, ("holds everything", 1.0, int(host_dram)), policy, timing)
    for f in sorted(FRACTIONS):
        for lanes, (data, hosts, _) in setups.items():
            ws = max(r["working_set_bytes"] for r in doc["rows"] if r["lanes"] == lanes and r["fraction"] == 1.0)
            for policy in POLICIES:
                timing = _run(doc, done, data, lanes, hosts, (f"{f:g} of the working set", f, int(f * ws / hosts)),
                              policy, timing)


def _run(doc, done, data, lanes, hosts, cap, policy, timing):
    label, fraction, segment = cap
    if (lanes, label, policy) in done:
        return timing
    t = time.process_time()
    row, timing = run_one(data, segment, policy, timing)
    row = {"lanes": lanes, "capacity": label, "fraction": fraction, "hosts": hosts,
           "segment_bytes_per_host": segment, "policy": policy, **row}
    doc["rows"].append(row)
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{lanes:5d} {label:28s} {policy:20s} done {row['completed']:6d} ttft p50 {row['ttft_p50_s']:.2f} "
          f"p90 {row['ttft_p90_s']:.2f} hit {row['hit_rate']:.3f} ws {row['working_set_bytes'] / 1e12:.2f} TB "
          f"idle-waiting {row['prefill_idle_waiting_frac']:.3f} cpu {time.process_time() - t:.0f} s", flush=True)
    return timing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", default="1536,4800")
    ap.add_argument("--start-s", type=float, default=60.0)
    ap.add_argument("--window-s", type=float, default=300.0)
    ap.add_argument("--resume", action="store_true", help="keep the rows already in the result file")
    ap.add_argument("--render", action="store_true", help="write the plot and docs page from the result file")
    args = ap.parse_args()
    if args.render:
        render(json.loads(OUT.read_text()), PLOT, PAGE)
        print(f"wrote {PLOT} and {PAGE}")
        return
    sweep(args)


if __name__ == "__main__":
    main()
