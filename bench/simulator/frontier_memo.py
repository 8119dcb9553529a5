"""What sharing a worker's step-cost memo saves a frontier search (rackserve.sim.run.shared_timing): the
committed search's replays of one configuration (the lane counts it bracketed a target with), run one
after another in one process as a search worker runs them, beside each in a fresh process (the memo
empty, as every replay was before). Then with a step store (rackserve/sim/step_store.py,
$RACKSERVE_STEP_STORE): each replay again in a fresh process, the store empty before the first (what a
search's workers, each its own process, share while it runs), and once more with the store holding
every step they priced (a second search of the same rack, or a resumed one). The figures must be equal;
the CPU is what changes.

Run: .venv/bin/python bench/simulator/frontier_memo.py [--frontier bench/results/frontier/nvl72-vr200/frontier.json]
         [--label "dep2x6+tp8x4 seqs256 chunk16k"] [--window-s S]
-> bench/results/simulator/frontier_memo.json and a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ("throughput_per_gpu", "tps_user_e2e_p90", "ttft_p90_s", "completed", "hit_rate")


def child(spec: str) -> None:
    """The replays of `spec` (a JSON file) in this process, in order: one JSON line per replay."""
    from rackserve.search.confirm import replay_point

    job = json.loads(Path(spec).read_text())
    for lanes, window in job["points"]:
        row = replay_point(job["rack"], job["config"], lanes, window)
        print(json.dumps({"lanes": lanes, "window_s": window, "cpu_s": row["cpu_s"],
                          **{k: row[k] for k in FIGURES}}), flush=True)


def _run(job: dict, path: Path, store: Path | None = None) -> list[dict]:
    path.write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if k != "RACKSERVE_STEP_STORE"}
    if store is not None:
        env["RACKSERVE_STEP_STORE"] = str(store)
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "_child", str(path)], cwd=ROOT,
                          capture_output=True, text=True, check=True, env=env)
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "_child":
        child(sys.argv[2])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frontier", type=Path, default=ROOT / "bench/results/frontier/nvl72-vr200/frontier.json")
    ap.add_argument("--label", default="dep2x6+tp8x4 seqs256 chunk16k")
    ap.add_argument("--window-s", type=float, default=None, help="replay window (default: each replay's own)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/simulator/frontier_memo.json")
    ap.add_argument("--work", type=Path, default=Path("/tmp/frontier-memo"))
    args = ap.parse_args()
    rep = json.loads(args.frontier.read_text())
    replays = [p for p in rep["points"] if p["source"] == "replay" and p["config"]["label"] == args.label]
    if not replays:
        raise SystemExit(f"--label: no replay of {args.label!r} in {args.frontier}")
    import yaml

    from rackserve.search.rack import RackSpec

    rack = RackSpec.model_validate(yaml.safe_load((ROOT / rep["rack_file"]).read_text())).model_dump()
    points = [[p["concurrency"], args.window_s or p["window_s"]] for p in replays]
    job = {"rack": rack, "config": replays[0]["config"], "points": points}
    args.work.mkdir(parents=True, exist_ok=True)
    shared = _run(job, args.work / "shared.json")
    fresh = [_run({**job, "points": [pt]}, args.work / f"fresh{i}.json")[0] for i, pt in enumerate(points)]
    store = args.work / "step-store"
    shutil.rmtree(store, ignore_errors=True)
    stored = [_run({**job, "points": [pt]}, args.work / f"stored{i}.json", store)[0] for i, pt in enumerate(points)]
    again = [_run({**job, "points": [pt]}, args.work / f"again{i}.json", store)[0] for i, pt in enumerate(points)]
    same = all({k: a[k] for k in FIGURES} == {k: b[k] for k in FIGURES}
               for rows in (fresh, stored, again) for a, b in zip(shared, rows, strict=True))
    out = {"command": "python bench/simulator/frontier_memo.py" + (f" --window-s {args.window_s:g}" if args.window_s else ""),
           "frontier": str(args.frontier.relative_to(ROOT)), "label": args.label,
           "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                    text=True).stdout.strip(),
           "figures_equal": same, "shared_cpu_s": sum(r["cpu_s"] for r in shared),
           "fresh_cpu_s": sum(r["cpu_s"] for r in fresh), "stored_cpu_s": sum(r["cpu_s"] for r in stored),
           "stored_again_cpu_s": sum(r["cpu_s"] for r in again),
           "replays": [{"lanes": s["lanes"], "window_s": s["window_s"], "fresh_cpu_s": f["cpu_s"],
                        "shared_cpu_s": s["cpu_s"], "stored_cpu_s": st["cpu_s"], "stored_again_cpu_s": ag["cpu_s"]}
                       for s, f, st, ag in zip(shared, fresh, stored, again, strict=True)],
           "load_average_1m": os.getloadavg()[0]}
    out["ratio_shared_over_fresh"] = out["shared_cpu_s"] / out["fresh_cpu_s"]
    out["ratio_stored_over_fresh"] = out["stored_cpu_s"] / out["fresh_cpu_s"]
    out["ratio_stored_again_over_fresh"] = out["stored_again_cpu_s"] / out["fresh_cpu_s"]
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    table = Table(title=f"{args.label}: replays in one worker vs each in a fresh process (figures equal: {same})")
    for col in ("lanes", "window s", "fresh CPU s", "shared-memo CPU s", "fresh + step store", "store filled"):
        table.add_column(col, justify="right")
    for r in out["replays"]:
        table.add_row(str(r["lanes"]), f"{r['window_s']:g}", f"{r['fresh_cpu_s']:.1f}", f"{r['shared_cpu_s']:.1f}",
                      f"{r['stored_cpu_s']:.1f}", f"{r['stored_again_cpu_s']:.1f}")
    table.add_row("all", "", f"{out['fresh_cpu_s']:.1f}", f"{out['shared_cpu_s']:.1f} ({out['ratio_shared_over_fresh']:.2f}x)",
                  f"{out['stored_cpu_s']:.1f} ({out['ratio_stored_over_fresh']:.2f}x)",
                  f"{out['stored_again_cpu_s']:.1f} ({out['ratio_stored_again_over_fresh']:.2f}x)")
    Console().print(table)
    if not same:
        raise SystemExit("figures differ between the shared, the fresh and the stored memo")


if __name__ == "__main__":
    main()
