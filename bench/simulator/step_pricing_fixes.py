"""Issue 31's before/after: nvl72-vr200 at 1,024 and 4,096 lanes over AgentX's 900 s window, and TP8
decode at batch 1, priced by the code before the step-pricing fixes (commit 1282f69, extracted with
`git archive` into a scratch folder) and by this checkout. Writes bench/results/simulator/step_pricing_fixes.json.

    .venv/bin/python bench/simulator/step_pricing_fixes.py [--lanes 1024,4096] [--work DIR]

Each (code, lanes) run is `rackserve sim scenarios/nvl72-vr200.yaml --concurrency L` of that code;
`--work` keeps the runs so a second call only collects (a 4,096-lane run costs ~10 CPU minutes).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BEFORE = "1282f69"  # the commit before 25ac0e9 (issue 31 items 1-4)
OUT = ROOT / "bench" / "results" / "simulator" / "step_pricing_fixes.json"
SCENARIO = "scenarios/nvl72-vr200.yaml"


def checkout(commit: str, into: Path) -> Path:
    if not (into / "rackserve").exists():
        into.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def rackserve(code: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(code), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "rackserve.cli", *args], cwd=code, env=env, check=False,
                          capture_output=True, text=True)


def sim(code: Path, lanes: int, out: Path) -> dict:
    path = out / "nvl72-vr200.json"
    if not path.exists():
        proc = rackserve(code, "sim", SCENARIO, "--concurrency", str(lanes), "--out", str(out))
        if not path.exists():
            raise RuntimeError(f"sim at {lanes} lanes ({code}) wrote nothing: {proc.stderr[-2000:]}")
    return json.loads(path.read_text())["results"][0]


def figures(r: dict) -> dict:
    """What the issue asks for, from one sim result (the old code lacks some: None there)."""
    load = r.get("decode_load") or {}
    return {
        "completed": r["completed"],
        "throughput_per_gpu": r["throughput_per_gpu"],
        "output_tps_per_gpu": r["output_tps_per_gpu"],
        "tps_user_e2e_p50": r.get("tps_user_e2e_p50"), "tps_user_e2e_p90": r.get("tps_user_e2e_p90"),
        "tps_user_itl_p50": r.get("tps_user_itl_p50", r.get("user_tps_p50")),
        "tps_user_itl_p90": r.get("tps_user_itl_p90", r.get("user_tps_p90")),
        "ttft_p50_s": r["ttft_p50_s"], "ttft_p90_s": r["ttft_p90_s"],
        "tpot_p50_s": r["tpot_p50_s"], "tpot_p90_s": r["tpot_p90_s"],
        "seqs_per_decode_rank": {k: load.get(f"seqs_per_rank_{k}") for k in ("mean", "p90", "max")} if load else None,
        "prefill_stepping_share": r.get("prefill_util"),
        "decode_stepping_share": r.get("decode_stepping_share", r.get("decode_util")),
        "decode_capacity_use": load.get("capacity_use"),
        "decode_tok_s_per_gpu": load.get("tok_s_per_gpu"),
        "decode_capacity_tok_s_per_gpu_at_batch": load.get("capacity_tok_s_per_gpu_at_batch"),
        "hit_rate": r["hit_rate"], "valid": r.get("valid"), "cpu_s": r.get("cpu_s"),
    }


def tp8_batch1(code: Path) -> dict:
    proc = rackserve(code, "timing", "--layout", "tp8", "--phase", "decode", "--batch", "1", "--json")
    d = json.loads(proc.stdout)
    return {k: d.get(k) for k in ("tokens_per_s_per_user", "tpot_s", "accepted_tokens", "verify_s", "draft_s")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", default="1024,4096")
    ap.add_argument("--work", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    args = ap.parse_args()
    lanes = [int(v) for v in args.lanes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        codes = {"before": checkout(BEFORE, work / "code-before"), "after": ROOT}
        rows = {}
        for name, code in codes.items():
            rows[name] = {"tp8_decode_batch1": tp8_batch1(code)}
            for n in lanes:
                rows[name][str(n)] = figures(sim(code, n, work / f"{name}-{n}"))
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    OUT.write_text(json.dumps({
        "what": "issue 31 before/after on nvl72-vr200 (12 DEP2 prefill + Wide-EP 48 decode), 900 s window",
        "command": "python bench/simulator/step_pricing_fixes.py --lanes " + args.lanes,
        "before": {"code": BEFORE, **rows["before"]}, "after": {"code": head, **rows["after"]},
    }, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
