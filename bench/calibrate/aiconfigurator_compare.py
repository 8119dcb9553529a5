"""Side by side with AIConfigurator: the same decode and prefill points on gb200/gb300, both models.

    .venv/bin/python bench/calibrate/aiconfigurator_compare.py [--aic-python .venv-aic/bin/python] [--quick]

AIConfigurator 0.12 (PyPI `aiconfigurator`, installed in its own venv because its dependencies
differ) predicts from silicon-measured kernel tables of DeepSeek-V4-Flash (the released V4, not
the V4.1 target), so ours is run on our `deepseek-v4-flash` spec built from the config AIConfigurator
bundles. Points: decode = `static_gen` with attention DP 4 + MoE EP 4 (our wide-ep ranks=4: a GB
tray has 4 GPUs and AIConfigurator has no cross-node EP data for this model), batch per DP rank,
context = ISL; prefill = `static_ctx` with attention DP 2 + MoE EP 2 (our dep2), one prompt per
rank. Ours uses the `baseline` preset (GB-era kernels, no Rubin switches). Ratio = ours / AIC.
The gb* parameters of our specs are NOT tuned to these numbers.
Writes bench/results/calibrate/aiconfigurator_compare.json and prints the ratio table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rackserve.timing import RankBatch, StepBatch, TimingModel  # noqa: E402

AIC_MODEL = "deepseek-ai/DeepSeek-V4-Flash"
DECODE = [(b, 8192) for b in (1, 8, 32, 64, 128)] + [(32, 32768)]  # (batch per rank, context)
PREFILL = [(isl, 0) for isl in (1024, 4096, 8192, 16384)] + [
    (8192, 6144)
]  # (prompt, cached prefix)

AIC_RUNNER = r"""
import json, sys, time, logging, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from aiconfigurator.cli.api import cli_estimate
out = []
for p in json.load(sys.stdin):
    t0 = time.time()
    try:
        r = cli_estimate(p["model"], p["system"], mode=p["mode"], backend_name=p["backend"], isl=p["isl"],
                         osl=p["osl"], batch_size=p["batch"], tp_size=1, attention_dp_size=p["dp"],
                         moe_tp_size=1, moe_ep_size=p["ep"], prefix=p["prefix"])
        out.append({**p, "ttft_ms": r.ttft, "tpot_ms": r.tpot, "aic_wall_s": time.time() - t0})
    except Exception as exc:
        out.append({**p, "error": f"{type(exc).__name__}: {exc}"[:300]})
    print(json.dumps(out[-1]), file=sys.stderr, flush=True)
print(json.dumps(out))
"""


def points(systems: list[str], backends: list[str], quick: bool) -> list[dict]:
    decode = DECODE[:2] if quick else DECODE
    prefill = PREFILL[:2] if quick else PREFILL
    pts = []
    for system in systems:
        for backend in backends:
            for b, ctx in decode:
                pts.append(
                    {
                        "model": AIC_MODEL,
                        "system": system,
                        "backend": backend,
                        "mode": "static_gen",
                        "phase": "decode",
                        "isl": ctx,
                        "osl": 2,
                        "batch": b,
                        "dp": 4,
                        "ep": 4,
                        "prefix": 0,
                    }
                )
            for isl, cached in prefill:
                pts.append(
                    {
                        "model": AIC_MODEL,
                        "system": system,
                        "backend": backend,
                        "mode": "static_ctx",
                        "phase": "prefill",
                        "isl": isl,
                        "osl": 1,
                        "batch": 1,
                        "dp": 2,
                        "ep": 2,
                        "prefix": cached,
                    }
                )
    return pts


def run_aic(aic_python: str, pts: list[dict]) -> list[dict]:
    proc = subprocess.run(
        [aic_python, "-c", AIC_RUNNER],
        input=json.dumps(pts),
        capture_output=True,
        text=True,
        timeout=3000,
        cwd="/tmp",
    )
    if proc.returncode != 0:
        raise SystemExit(f"AIConfigurator runner failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ours(p: dict, model: str, opt: str) -> float:
    """Our step time in ms for the same point."""
    tm = TimingModel.create(p["system"], model, opt)
    if p["phase"] == "decode":
        lay = tm.layout("wide-ep", ranks=p["dp"])
        rank = RankBatch.of([1] * p["batch"], [p["isl"]] * p["batch"])
        return tm.step_time("decode", lay, StepBatch((rank,) * lay.dp)).total_s * 1e3
    lay = tm.layout("dep2")
    rank = RankBatch.of([p["isl"] - p["prefix"]], [p["prefix"]])
    return tm.step_time("prefill", lay, StepBatch((rank,) * lay.dp)).total_s * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--aic-python", default=str(ROOT / ".venv-aic/bin/python"))
    ap.add_argument("--systems", default="gb200,gb300")
    ap.add_argument("--backends", default="vllm,sglang")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--aic-cache", default="", help="reuse/store AIConfigurator's raw answers here")
    ap.add_argument("--out", default=str(ROOT / "bench/results/calibrate/aiconfigurator_compare.json"))
    args = ap.parse_args()
    pts = points(args.systems.split(","), args.backends.split(","), args.quick)
    t0 = time.time()
    cache = Path(args.aic_cache) if args.aic_cache else None
    aic_answers = f"run now ({args.aic_python})"
    if cache and cache.exists():
        rows = json.loads(cache.read_text())
        aic_answers = f"reused from {cache} (AIConfigurator's answers do not depend on our model)"
    else:
        rows = run_aic(args.aic_python, pts)
        if cache:
            cache.write_text(json.dumps(rows))
    for r in rows:
        key = "tpot_ms" if r["phase"] == "decode" else "ttft_ms"
        r["aic_ms"] = r.get(key)
        r["ours_ms"] = ours(r, "deepseek-v4-flash", "baseline")
        r["ours_v41_flash_ms"] = ours(r, "deepseek-v4.1-flash", "baseline")
        r["ratio"] = r["ours_ms"] / r["aic_ms"] if r.get("aic_ms") else None
    print(
        f"{'system':6} {'backend':7} {'phase':7} {'batch':>5} {'isl':>6} {'prefix':>6} {'AIC ms':>9} {'ours ms':>9} {'ours/AIC':>8}"
    )
    for r in rows:
        if r.get("ratio") is None:
            print(
                f"{r['system']:6} {r['backend']:7} {r['phase']:7} {r['batch']:5d} {r['isl']:6d} {r['prefix']:6d}  AIC error: {r.get('error', '')[:60]}"
            )
            continue
        print(
            f"{r['system']:6} {r['backend']:7} {r['phase']:7} {r['batch']:5d} {r['isl']:6d} {r['prefix']:6d} "
            f"{r['aic_ms']:9.3f} {r['ours_ms']:9.3f} {r['ratio']:8.2f}"
        )
    summary = {}
    for system in args.systems.split(","):
        for backend in args.backends.split(","):
            for phase in ("decode", "prefill"):
                rs = [
                    r["ratio"]
                    for r in rows
                    if r.get("ratio")
                    and r["system"] == system
                    and r["backend"] == backend
                    and r["phase"] == phase
                ]
                if rs:
                    summary[f"{system}/{backend}/{phase}"] = {
                        "n": len(rs),
                        "median_ratio": statistics.median(rs),
                        "min_ratio": min(rs),
                        "max_ratio": max(rs),
                    }
    for key, s in summary.items():
        print(
            f"{key:28} median ours/AIC {s['median_ratio']:.2f} (range {s['min_ratio']:.2f}..{s['max_ratio']:.2f}, n={s['n']})"
        )
    report = {
        "command": "python bench/calibrate/aiconfigurator_compare.py",
        "aiconfigurator": "0.12.0",
        "aic_model": AIC_MODEL,
        "ours_model": "deepseek-v4-flash",
        "ours_optimizations": "baseline",
        "note": __doc__,
        "tuned_to_aic": False,
        "aic_answers": aic_answers,
        "wall_s": time.time() - t0,
        "summary": summary,
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
