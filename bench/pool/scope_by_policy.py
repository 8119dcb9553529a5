"""Issue 32's matrix on agentx-3dep2-wideep, at a SHORT window: pool scope {rack, instance, agentx}
x policy {least-uncached-work, dynamo-kv, round-robin} at the given lanes: requests completed, TTFT
P50/P90 and its breakdown, hit rate by tier, prefill rank idle (per instance), routing regret,
prefill time spent waiting for pooled KV. The issue asks for AgentX's 900 s window; this runs
`--window-s` (default 60 s) after a `--start-s` settle, which a 2-core shared machine can afford.

    .venv/bin/python bench/pool/scope_by_policy.py --lanes 1536 [--window-s 60 --start-s 30]
        -> bench/results/pool/scope_by_policy_<lanes>.json (one run at a time)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import yaml

from rackserve.sim.run import simulate, timing_for
from rackserve.sim.scenario import scenario_from_dict

ROOT = Path(__file__).resolve().parents[2]
SCOPES = ("rack", "instance", "agentx")
POLICIES = ("least-uncached-work", "dynamo-kv", "round-robin")
KEEP = ("completed", "arrivals", "rejected", "throughput_per_gpu", "ttft_p50_s", "ttft_p90_s", "ttft_breakdown_s",
        "hit_rate", "hit_rate_by_tier", "predicted_hit_rate", "prefill_idle_frac", "prefill_idle_by_instance",
        "prefill_util", "regret_mean_s", "regret_p90_s", "prefill_kv_transfer_frac", "pool_path_util",
        "pool_occupancy", "tps_user_e2e_p90", "cpu_s")


def scenario(lanes: int, scope: str, start_s: float, window_s: float, balance: bool = True):
    data = yaml.safe_load((ROOT / "scenarios" / "agentx-3dep2-wideep.yaml").read_text())
    data["workload"].update(concurrency=lanes, measure_start_s=start_s, duration_s=start_s + window_s)
    data["pool"] = {**data.get("pool", {}), "scope": scope}
    data["routing"] = {**data.get("routing", {}), "lockstep_balance": balance}
    return scenario_from_dict(data, name=f"agentx-3dep2-wideep/{scope}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", type=int, default=1536)
    ap.add_argument("--start-s", type=float, default=30.0)
    ap.add_argument("--window-s", type=float, default=60.0)
    ap.add_argument("--scopes", default=",".join(SCOPES))
    ap.add_argument("--policies", default=",".join(POLICIES))
    args = ap.parse_args()
    rows = []
    timing = None
    for scope in args.scopes.split(","):
        for policy in args.policies.split(","):
            # "least-uncached-work/no-balance": without the lockstep term (routing.lockstep_balance false)
            name, _, variant = policy.partition("/")
            sc = scenario(args.lanes, scope, args.start_s, args.window_s, balance=variant != "no-balance")
            timing = timing or timing_for(sc)
            t = time.process_time()
            res = simulate(sc, policy=name, timing=timing).to_dict()
            row = {"scope": scope, "policy": policy, **{k: res[k] for k in KEEP}}
            rows.append(row)
            print(f"{scope:9s} {policy:32s} done {row['completed']:6d} ttft p50 {row['ttft_p50_s']:.3f} "
                  f"p90 {row['ttft_p90_s']:.3f} hit {row['hit_rate']:.3f} idle {row['prefill_idle_frac']:.3f} "
                  f"regret {row['regret_mean_s'] * 1e3:.2f} ms  cpu {time.process_time() - t:.0f} s", flush=True)
    out = ROOT / "bench" / "results" / "pool" / f"scope_by_policy_{args.lanes}.json"
    meta = {"scenario": "scenarios/agentx-3dep2-wideep.yaml", "lanes": args.lanes, "measure_start_s": args.start_s,
            "window_s": args.window_s,
            "note": "AgentX's 900 s window" if args.window_s >= 900 else "SHORT window, not AgentX's 900 s",
            "command": f"python bench/pool/scope_by_policy.py --lanes {args.lanes} --start-s {args.start_s:g} "
                       f"--window-s {args.window_s:g}"}
    out.write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
