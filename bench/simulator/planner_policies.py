"""Issue 52: one load step under each planner policy: SLA attainment (TTFT and ITL within targets)
and GPU-hours, beside every fixed deployment the built instances allow (P prefill x D decode held all
run: "fixed-PxD") and the best of them: the fewest GPU-hours with attainment >= BEST_FIXED_ATTAINMENT.

Run: .venv/bin/python bench/simulator/planner_policies.py [--scenario scenarios/planner-step.yaml] [--out FILE]
-> bench/results/simulator/planner.json ({"command", "scenario", "rows": [{"run", "policy", ...}],
   "timelines": {run: SimResult.planner["timeline"]}}) and planner.png (the timelines).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from rackserve.sim.planner_plot import plot_planner_timeline
from rackserve.sim.run import simulate, timing_for
from rackserve.sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "results" / "simulator" / "planner.json"
PLANNED = {  # run name -> planner fields replaced
    "load": {"policy": "load", "initial_prefill": 1, "initial_decode": 1},
    "sla": {"policy": "sla", "initial_prefill": 1, "initial_decode": 1},
}
BEST_FIXED_ATTAINMENT = 0.95  # the share of requests within both targets a "best" fixed deployment reaches


def runs(base) -> dict[str, dict]:
    """The planned runs, then every fixed P x D the deployment builds."""
    dep = base.config.deployment
    fixed = {f"fixed-{p}x{d}": {"policy": "fixed", "initial_prefill": p, "initial_decode": d}
             for p in range(1, dep.prefill[0].count + 1) for d in range(1, dep.decode[0].count + 1)}
    return {**PLANNED, **fixed}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default="scenarios/planner-step.yaml")
    ap.add_argument("--out", default=str(OUT), help="the JSON (its .png beside it)")
    args = ap.parse_args()
    out_path = Path(args.out)
    base = load_scenario(ROOT / args.scenario)
    timing = timing_for(base)
    rows, timelines, results = [], {}, []
    for name, fields in runs(base).items():
        sc = dataclasses.replace(base, planner=base.planner.model_copy(update=fields))
        cpu = time.process_time()
        r = simulate(sc, timing=timing)
        p = r.planner
        rows.append({"run": name, "policy": p["policy"], "sla_attainment": p["sla_attainment"],
                     "ttft_attainment": p["ttft_attainment"], "itl_attainment": p["itl_attainment"],
                     "gpu_hours": p["gpu_hours"], "mean_gpus": p["mean_gpus"], "completed": r.completed,
                     "ttft_p90_s": r.ttft_p90_s, "tpot_p90_s": r.tpot_p90_s, "startup_s": p["startup_s"],
                     "cpu_s": time.process_time() - cpu})
        timelines[name] = p["timeline"]
        results.append(r)
        print(f"{name:10s} attainment {p['sla_attainment']:6.1%} (TTFT {p['ttft_attainment']:6.1%}, "
              f"ITL {p['itl_attainment']:6.1%})  {p['gpu_hours']:.2f} GPU-h  mean {p['mean_gpus']:.1f} GPUs  "
              f"{r.completed} done  {rows[-1]['cpu_s']:.0f} CPU s", flush=True)
    sc = base.planner
    good = [r for r in rows if r["run"].startswith("fixed-") and r["sla_attainment"] >= BEST_FIXED_ATTAINMENT]
    best = min(good, key=lambda r: (r["gpu_hours"], -r["sla_attainment"]))["run"] if good else None
    out = {"command": "python bench/simulator/planner_policies.py " + " ".join(sys.argv[1:]),
           "scenario": args.scenario, "ttft_target_s": sc.ttft_target_s, "itl_target_s": sc.itl_target_s,
           "tick_s": sc.tick_s, "best_fixed_attainment": BEST_FIXED_ATTAINMENT, "best_fixed": best,
           "rows": rows, "timelines": timelines}
    out_path.write_text(json.dumps(out, indent=1) + "\n")
    shown = [i for i, r in enumerate(rows) if r["run"] in (*PLANNED, best, "fixed-1x1")]
    plot_planner_timeline([results[i] for i in shown], out_path.with_suffix(".png"), labels=[rows[i]["run"] for i in shown])
    print(f"best fixed (attainment >= {BEST_FIXED_ATTAINMENT:.0%}): {best}")
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
