"""Issue 52 item 3's figures: the planner in the live cluster (`rackserve up --engine mock`, real Ray rank
actors started and stopped by the router's planner) beside the same planner in `rackserve sim`, on one
load step: SLA attainment, GPU-hours, requests and the instances over time, per policy.

The scenario's uniform closed loop (workload.lanes_schedule) is driven live by a client of as many
lanes as the schedule says at each moment (planner seconds = wall / time_scale); each request is a
random token-id prompt of workload.prompt_tokens, workload.output_tokens generated (ignore_eos). Its
TTFT / ITL are the router's simulated figures (the response's `rackserve` object), judged against the
planner's targets as the simulator judges its own; GPU-hours are the planner's held-GPU step function
(`/admin/planner`) over the client's window. The simulator replays the same scenario at the live
engine's sizes (services/bench/live_vs_sim.sim_scenario: chunk, batch, KV blocks of the mock ranks).

Run: .venv/bin/python bench/simulator/planner_live.py [--scenario scenarios/planner-live.yaml]
     [--policies sla,load] [--time-scale 1]
-> bench/results/simulator/planner_live.json ({"command", "load_avg", "rows": [{"policy", "side", ...}]})
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from rackserve.config import load_config
from rackserve.model.config import VOCAB_SIZE
from rackserve.planner.fleet import gpu_seconds
from rackserve.sim.run import simulate
from rackserve.sim.scenario import parse_workload
from services.bench.live_vs_sim import sim_scenario
from services.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "results" / "simulator" / "planner_live.json"
STARTS = {"sla": (1, 1), "load": (1, 1)}  # planned runs start from the fewest (as planner_policies.py)


def lanes_at(schedule: list[list[float]], t: float) -> int:
    """The lane count the schedule gives at planner second `t` (the last step at or before it)."""
    n = 0
    for start, lanes in schedule:
        if t >= start:
            n = int(lanes)
    return n


def attainment(records: list[dict], ttft_target_s: float, itl_target_s: float) -> dict:
    """Shares of finished requests within the TTFT target, the ITL target and both (the
    simulator's rule: ITL = time per output token after the first; one token has no ITL)."""
    n = len(records)
    ttft = [r["ttft_s"] <= ttft_target_s for r in records]
    itl = [r["tpot_s"] is None or r["tpot_s"] <= itl_target_s for r in records]
    share = (lambda k: k / n) if n else (lambda k: float("nan"))
    return {"requests": n, "sla_attainment": share(sum(a and b for a, b in zip(ttft, itl, strict=True))),
            "ttft_attainment": share(sum(ttft)), "itl_attainment": share(sum(itl))}


# -- live --------------------------------------------------------------------------------------------
def start_cluster(config: Path, port: int, env: dict[str, str]) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "services.launcher", "--config", str(config), "--port", str(port),
                             "--engine", "mock", "--timeout", "300"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **env})
    for line in proc.stdout:  # type: ignore[union-attr]
        if line.strip().startswith("logs"):
            return proc
    raise RuntimeError("rackserve up exited before it was up")


async def drive(base: str, schedule: list[list[float]], horizon_s: float, prompt_tokens: int, output_tokens: int,
                scale: float, seed: int) -> dict:
    """The closed loop live; every request's server figures and the planner's state after."""
    rng = np.random.default_rng(seed)
    records: list[dict] = []
    failed: list[str] = []
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=512)) as client:
        start_s = (await client.get(f"{base}/admin/planner")).json()["now_s"]  # planner clock at our t=0
        t0 = time.monotonic()
        now = lambda: (time.monotonic() - t0) / scale  # noqa: E731

        async def lane(i: int) -> None:
            while now() < horizon_s:
                if lanes_at(schedule, now()) <= i:
                    await asyncio.sleep(0.05 * scale)
                    continue
                prompt = rng.integers(16, VOCAB_SIZE - 8, size=prompt_tokens).tolist()
                body = {"model": "rackserve-moe-small", "prompt": prompt, "max_tokens": output_tokens,
                        "ignore_eos": True, "temperature": 0.0}
                try:
                    r = await client.post(f"{base}/v1/completions", json=body)
                except httpx.HTTPError as exc:
                    failed.append(f"{type(exc).__name__}: {exc}")
                    continue
                if r.status_code != 200:
                    failed.append(f"HTTP {r.status_code}: {r.text[:200]}")
                    continue
                t = r.json()["rackserve"]
                n = r.json()["usage"]["completion_tokens"]
                records.append({"end_s": now(), "ttft_s": t["ttft_s"], "tpot_s": t["tpot_s"] if n > 1 else None,
                                "lag_s": t["pacing_lag_s"]})

        most = max(int(lanes) for _, lanes in schedule)
        await asyncio.gather(*(lane(i) for i in range(most)))
        state = (await client.get(f"{base}/admin/planner")).json()
    return {"records": records, "failed": failed, "start_s": start_s, "planner": state}


def run_live(scenario: Path, policy: str, scale: float) -> dict:
    cfg = load_config(scenario)
    env = {"RACKSERVE_PLANNER__POLICY": policy, "RACKSERVE_CLUSTER__TIME_SCALE": str(scale)}
    if policy in STARTS:
        env |= {"RACKSERVE_PLANNER__INITIAL_PREFILL": str(STARTS[policy][0]),
                "RACKSERVE_PLANNER__INITIAL_DECODE": str(STARTS[policy][1])}
    port = free_port()
    started = time.monotonic()
    proc = start_cluster(scenario, port, env)
    up_s = time.monotonic() - started
    w, horizon = cfg.workload, float(cfg.sim["horizon_s"])
    try:
        live = asyncio.run(drive(f"http://127.0.0.1:{port}", w["lanes_schedule"], horizon, w["prompt_tokens"],
                                 w["output_tokens"], scale, w.get("seed", 0)))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    p, s = live["planner"], cfg.planner
    report = p["report"]
    start = live["start_s"]
    seconds = gpu_seconds([tuple(x) for x in report["gpus_held"]], start, start + horizon)
    counted = [r for r in live["records"] if r["end_s"] <= horizon]
    return {"policy": policy, "side": "live", **attainment(counted, s.ttft_target_s, s.itl_target_s),
            "gpu_hours": seconds / 3600.0, "mean_gpus": seconds / horizon, "failed": len(live["failed"]),
            # wall seconds the ranks' steps ran behind their pacing, per request (the machine not keeping up)
            "pacing_lag_s_mean": float(np.mean([r["lag_s"] for r in counted])) if counted else float("nan"),
            "errors": live["failed"][:3], "startup_s": report["startup_s"], "up_s": up_s,
            "decisions": [d for d in p["decisions"] if d["changes"]], "time_scale": scale}


# -- the simulator --------------------------------------------------------------------------------------
def run_sim(scenario: Path, policy: str, scale: float) -> dict:
    cfg = load_config(scenario)
    base = sim_scenario(cfg, scale)
    horizon = float(cfg.sim["horizon_s"])
    fields = {"policy": policy}
    if policy in STARTS:
        fields |= {"initial_prefill": STARTS[policy][0], "initial_decode": STARTS[policy][1]}
    sc = dataclasses.replace(base, workload=parse_workload(cfg.workload),
                             sim=base.sim.model_copy(update={"horizon_s": horizon, "measure_duration_s": horizon}),
                             planner=cfg.planner.model_copy(update=fields))
    r = simulate(sc)
    p = r.planner
    return {"policy": policy, "side": "sim", "requests": p["requests"], "sla_attainment": p["sla_attainment"],
            "ttft_attainment": p["ttft_attainment"], "itl_attainment": p["itl_attainment"],
            "gpu_hours": p["gpu_hours"], "mean_gpus": p["mean_gpus"], "failed": r.rejected,
            "startup_s": p["startup_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="scenarios/planner-live.yaml")
    ap.add_argument("--policies", default="sla,load")
    ap.add_argument("--time-scale", type=float, default=1.0, help="wall s per simulated s of the live run")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    scenario = ROOT / args.scenario
    rows = []
    for policy in args.policies.split(","):
        for side in (run_live, run_sim):
            row = side(scenario, policy, args.time_scale)
            rows.append(row)
            print(f"{row['policy']:6s} {row['side']:4s} attainment {row['sla_attainment']:6.1%} "
                  f"(TTFT {row['ttft_attainment']:6.1%}, ITL {row['itl_attainment']:6.1%})  "
                  f"{row['gpu_hours']:.3f} GPU-h  mean {row['mean_gpus']:.1f} GPUs  {row['requests']} requests  "
                  f"failed {row['failed']}", flush=True)
    out = {"command": "bench/simulator/planner_live.py " + " ".join(sys.argv[1:]), "scenario": args.scenario,
           "load_avg_1m": os.getloadavg()[0], "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
