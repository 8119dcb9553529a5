"""Issue 52 item 4: rackserve's planner beside NVIDIA Dynamo's replay on the same requests and SLA: SLA
attainment (TTFT, ITL, both) and GPU-hours in one table.

Run: .venv/bin/python bench/simulator/planner_vs_dynamo.py [--scenario scenarios/planner-step.yaml]
-> bench/results/simulator/planner_vs_dynamo.json (+ .md beside it, the table).

The same requests: scenarios/planner-step.yaml is a closed loop (16 -> 192 -> 16 lanes). Dynamo 1.6.1's replay
has a closed loop only at one fixed concurrency (`replay_concurrency`), no lane schedule, so the load step is
exported as an open-loop Mooncake trace: the requests the scenario's lanes issue when the largest deployment
(REFERENCE_RUN) serves them, at the times they issue them (8,000-token prompts, 600 output tokens, unique
hash_ids: no prefix reuse). Both sides replay that file: rackserve via `with_trace` (the scenario's deployment,
SLA, planner tick and start-up delay), Dynamo via `run_trace_replay`'s engine (`dynamo._core`) in a subprocess of
the separate venv .venv-peers (bench/simulator/vs_dynamo.py says how it is installed).

Dynamo's side, worker for instance: a prefill worker is one DEP2 instance (dp_size 2: 2 GPUs), a decode worker one
Wide-EP 8 instance (dp_size 8), each DP rank with rackserve's per-rank KV blocks, max_num_seqs and
max_num_batched_tokens; kv_router. Its mocker prices steps with its own model, by default a polynomial; here it
reads a `dynamo_profile` NPZ (prefill_isl x prefill_ttft_ms, decode_active_kv_tokens x decode_context_length ->
decode_itl, per DP rank) that this script fills from rackserve's vr200 cost model (mocker_profile): the mocker
interpolates one number per step where rackserve prices the whole lockstep batch (all ranks equal here), and
the mocker's P/D KV hand-off is instantaneous (rackserve's costs ~1 ms).

Dynamo's planner could not run here: `dynamo.replay.planner` (its replay-with-planner path) imports
`aisimulate.runner`, and `dynamo.planner.core.perf_model` (which every planner mode, load-based included, loads)
imports `aisimulate_core.sdk`; aisimulate 0.13.0 on PyPI is a stub whose real wheel is fetched from NVIDIA's own
index, which this machine cannot reach. The JSON records that under "skipped" (the import error, re-checked on
every run). What runs instead on Dynamo's side: every fixed P x D, and rackserve's planner decisions (its
timeline of planned instances) replayed through the replay's scaling-policy hook (`initial_tick_ms` / `on_tick`,
the hook Dynamo's planner adapter uses), with the mocker's `startup_time` set to rackserve's start-up delay,
and, as a diagnostic, the fixed runs with one decode instance again with KV_CHECK_X times its ranks' KV blocks
(the mocker admits a decode request only with blocks for its whole context).

Attainment, both sides alike: the share of requests finished inside the measured window (0-480 s) with TTFT <=
the target and ITL = (last token - first token) / (output tokens - 1) <= the target. GPU-hours: instances held
(starting, active and draining) x GPUs per instance, integrated over the window; Dynamo's from the replay's
worker counts sampled every SAMPLE_S.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from rackserve.sim.run import simulate, timing_for, with_trace
from rackserve.sim.scenario import Scenario, load_scenario
from rackserve.timing.batch import RankBatch, StepBatch
from rackserve.workload.mooncake import TRACE_BLOCK_TOKENS

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "results" / "simulator" / "planner_vs_dynamo.json"
PEERS_PY = ROOT / ".venv-peers" / "bin" / "python"
REFERENCE_RUN = {"policy": "fixed", "initial_prefill": 4, "initial_decode": 3}  # whose lanes' requests are the trace
PLANNED = ("load", "sla")
KV_CHECK_X = 4  # a diagnostic: the 1-decode fixed runs again with this many times the decode ranks' KV blocks
SAMPLE_S = 1.0  # how often the scripted scaling policy samples Dynamo's worker counts (GPU-hours)


class RecordingSource:
    """An ArrivalSource that keeps every request the wrapped (closed-loop) source issues."""

    def __init__(self, inner) -> None:
        self.inner, self.issued = inner, []

    def start(self) -> list:
        return self._keep(self.inner.start())

    def on_done(self, request, now_s: float) -> list:
        return self._keep(self.inner.on_done(request, now_s))

    def _keep(self, requests: list) -> list:
        self.issued.extend(requests)
        return requests


def planned(base: Scenario, fields: dict) -> Scenario:
    return dataclasses.replace(base, planner=base.planner.model_copy(update=fields))


def load_step_requests(base: Scenario) -> list:
    """The requests the scenario's lanes issue inside the horizon when REFERENCE_RUN serves them."""
    from rackserve.sim.run import source_factory

    sc = planned(base, REFERENCE_RUN)
    source = RecordingSource(source_factory(sc)())
    simulate(sc, source)
    horizon = base.sim.horizon_s
    return sorted((r for r in source.issued if r.arrival_s < horizon), key=lambda r: (r.arrival_s, r.req_id))


def mooncake_records(requests: list) -> list[dict]:
    """Mooncake JSONL records of `requests`: their arrival times (ms), lengths, and hash ids unique to each
    request (one per 512-token block), so no two share a block, as in the scenario's uniform prompts."""
    out, next_id = [], 0
    for r in requests:
        blocks = math.ceil(r.prompt_tokens / TRACE_BLOCK_TOKENS)
        out.append({"timestamp": round(r.arrival_s * 1e3, 3), "input_length": r.prompt_tokens,
                    "output_length": r.output_tokens, "hash_ids": list(range(next_id, next_id + blocks))})
        next_id += blocks
    return out


def write_trace(records: list[dict], path: Path) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def attainment(requests: list[dict], ttft_target_s: float, itl_target_s: float, window_end_s: float) -> dict:
    """rackserve's attainment (rackserve/sim/planned.py on_finish) from Dynamo-style per-request records
    (arrival_time_ms, first_token_ms, last_token_ms, output_length): the requests finished by window_end_s."""
    done = ok_ttft = ok_itl = ok_both = 0
    for r in requests:
        if r.get("last_token_ms") is None or r["last_token_ms"] / 1e3 > window_end_s:
            continue
        ttft = (r["first_token_ms"] - r["arrival_time_ms"]) / 1e3
        n = r["output_length"]
        itl = (r["last_token_ms"] - r["first_token_ms"]) / 1e3 / (n - 1) if n > 1 else None
        t_ok, i_ok = ttft <= ttft_target_s, itl is None or itl <= itl_target_s
        done += 1
        ok_ttft += t_ok
        ok_itl += i_ok
        ok_both += t_ok and i_ok
    share = (lambda k: k / done) if done else (lambda k: math.nan)
    return {"requests": done, "ttft_attainment": share(ok_ttft), "itl_attainment": share(ok_itl),
            "sla_attainment": share(ok_both)}


def gpu_hours(timeline: list[tuple[float, int, int]], gpus: tuple[int, int], window: tuple[float, float]) -> dict:
    """GPU-hours and mean GPUs over `window` (s) of a step-wise worker-count timeline [(t_s, prefill, decode)]:
    each count holds from its time to the next entry's (the last to the window's end)."""
    start, end = window
    seconds = 0.0
    for i, (t, p, d) in enumerate(timeline):
        t_next = timeline[i + 1][0] if i + 1 < len(timeline) else end
        lo, hi = max(t, start), min(t_next, end)
        if hi > lo:
            seconds += (p * gpus[0] + d * gpus[1]) * (hi - lo)
    return {"gpu_hours": seconds / 3600.0, "mean_gpus": seconds / (end - start)}


def mocker_profile(base: Scenario, path: Path) -> dict:
    """A dynamo_profile NPZ from rackserve's cost model: one DP rank's prefill step of n tokens and decode
    step of b sequences at context c (every rank of the lockstep instance alike). Returns the grid."""
    from rackserve.sim.run import simulator_for, source_factory

    timing = timing_for(base)
    sim = simulator_for(base)(base, timing, base.config.routing.policy, source_factory(base)())
    p, d, sz = sim.prefill[0], sim.decode[0], sim.sizing
    tm = timing.timing
    isl = np.array([64, 512, 1024, 2048, 4096, 6144, 8192, 12288, 16384], dtype=float)
    ttft = [tm.step_time("prefill", p.layout, StepBatch((RankBatch.of([int(n)]),) * p.layout.dp)).total_s * 1e3
            for n in isl]
    kv = np.array([1e3, 1e4, 5e4, 1e5, 2e5, 4e5, 8e5], dtype=float)
    ctx = np.array([500, 2000, 4000, 8000, 8600, 12000], dtype=float)
    cap = sz.decode_max_seqs[0]

    def itl_ms(k: float, c: float) -> float:
        b = int(min(cap, max(1, round(k / c))))
        batch = StepBatch((RankBatch.of([1] * b, [int(c)] * b),) * d.layout.dp)
        return tm.decode_token_time(d.layout, batch).total_s * 1e3

    itl = np.array([[itl_ms(k, c) for c in ctx] for k in kv])
    np.savez(path, prefill_isl=isl, prefill_ttft_ms=np.array(ttft), decode_active_kv_tokens=kv,
             decode_context_length=ctx, decode_itl=itl)
    block = base.config.timing.target_block_tokens
    return {"prefill_dp": p.layout.dp, "decode_dp": d.layout.dp, "prefill_gpus": p.gpus, "decode_gpus": d.gpus,
            "block_size": block, "prefill_gpu_blocks": sz.prefill_cache_tokens[0] // block,
            "decode_gpu_blocks": sz.decode_kv_tokens[0] // block, "max_num_seqs": cap,
            "max_num_batched_tokens": sz.prefill_chunk_tokens,
            "prefill_ttft_ms": dict(zip(isl.astype(int).tolist(), ttft, strict=True)),
            "decode_itl_ms_at_8000": dict(zip(kv.astype(int).tolist(), itl[:, 3].tolist(), strict=True))}


DYNAMO_SCRIPT = r"""
import json, sys
from dynamo._core import run_mocker_trace_replay

job = json.load(open(sys.argv[1]))
w, sample_s, end_s = job["workers"], job["sample_s"], job["window_end_s"]
timing = {"type": "external", "provider": "dynamo_profile", "config": {"path": job["profile"]}}

def engine(role):
    return {"dp_size": w[role + "_dp"], "startup_time": job["startup_s"][role],
            "engine": {"block_size": w["block_size"], "num_gpu_blocks": w[role + "_gpu_blocks"],
                       "max_num_seqs": w["max_num_seqs"], "max_num_batched_tokens": w["max_num_batched_tokens"],
                       "worker_type": role, "timing_model": timing}}

class Scripted:
    # the replay's scaling-policy hook (what dynamo.planner.offline.replay_adapter implements): sets the
    # targets of `targets` [(t_s, prefill, decode)] at their times, samples the workers held every sample_s
    def __init__(self, targets, initial):
        self.targets, self.i, self.t = targets, 0, sample_s
        self.timeline = [(0.0, *initial)]
    def initial_tick_ms(self):
        return self.t * 1e3
    def on_tick(self, snap):
        held = [len(snap[f"active_{r}_ids"]) + len(snap.get(f"starting_{r}_ids", []))
                + len(snap.get(f"draining_{r}_ids", [])) for r in ("prefill", "decode")]
        self.timeline.append((self.t, *held))
        tp = td = None
        while self.i < len(self.targets) and self.targets[self.i][0] <= self.t + 1e-9:
            _, tp, td = self.targets[self.i]
            self.i += 1
        self.t += sample_s
        return {"target_prefill": tp, "target_decode": td, "next_tick_ms": self.t * 1e3 if self.t <= end_s else None}

KEEP = ("arrival_time_ms", "first_token_ms", "last_token_ms", "output_length", "terminal_status")
out = {}
for run in job["runs"]:
    p, d = run["initial"]
    policy = Scripted(run["targets"], run["initial"]) if run.get("targets") is not None else None
    native = run_mocker_trace_replay([job["trace"]], prefill_engine_args=engine("prefill"),
                                     decode_engine_args=engine("decode"), num_prefill_workers=p,
                                     num_decode_workers=d, router_mode="kv_router", trace_block_size=512,
                                     capture_per_request=True, capture_planner_details=False,
                                     scaling_policy=policy)
    out[run["name"]] = {"per_request": [{k: r.get(k) for k in KEEP} for r in native.per_request],
                        "timeline": policy.timeline if policy else [(0.0, p, d)],
                        "wall_time_ms": native.summary["wall_time_ms"]}
json.dump(out, open(sys.argv[2], "w"))
"""

PLANNER_PROBE = r"""
import importlib
for name in ("dynamo.replay.planner", "dynamo.planner.core.perf_model"):
    try:
        importlib.import_module(name)
        print(name, "imports")
    except Exception as exc:
        print(name, "->", type(exc).__name__ + ":", exc)
"""


def dynamo_planner_skip() -> str | None:
    """Why Dynamo's planner cannot run in its replay here (None: its modules import)."""
    if not PEERS_PY.exists():
        return f"no {PEERS_PY.relative_to(ROOT)} (bench/simulator/vs_dynamo.py's docstring installs it)"
    proc = subprocess.run([str(PEERS_PY), "-c", PLANNER_PROBE], capture_output=True, text=True, timeout=300)
    lines = proc.stdout.strip().splitlines()
    if all(line.endswith(" imports") for line in lines):
        return None
    return ("; ".join(lines) + ". aisimulate 0.13.0 on PyPI is a stub that downloads the real wheel from NVIDIA's "
            "index at install, unreachable here; without it neither the replay's planner path nor the planner's "
            "perf-model package (loaded by every mode, load-based included) imports")


def decisions(timeline: dict) -> list[tuple[float, int, int]]:
    """rackserve's planner decisions [(t_s, prefill, decode)]: a tick records the instances planned before it
    decides, so the decision taken at tick k is what tick k + 1 records."""
    t, p, d = timeline["t_s"], timeline["prefill_planned"], timeline["decode_planned"]
    return [(t[k], p[k + 1], d[k + 1]) for k in range(len(t) - 1)]


def run_dynamo(job: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="planner-vs-dynamo-") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_path.write_text(json.dumps(job))
        env = {**os.environ, "RUST_LOG": "error", "DYN_LOG": "error"}
        subprocess.run([str(PEERS_PY), "-c", DYNAMO_SCRIPT, str(job_path), str(out_path)], env=env, check=True,
                       timeout=3600)
        return json.loads(out_path.read_text())


def fixed_runs(base: Scenario) -> dict[str, tuple[int, int]]:
    dep = base.config.deployment
    return {f"fixed-{p}x{d}": (p, d) for p in range(1, dep.prefill[0].count + 1)
            for d in range(1, dep.decode[0].count + 1)}


def row(simulator: str, run: str, planner: str, figures: dict) -> dict:
    keys = ("ttft_attainment", "itl_attainment", "sla_attainment", "gpu_hours", "mean_gpus", "requests")
    return {"simulator": simulator, "run": run, "planner": planner, **{k: figures[k] for k in keys}}


def ours(base: Scenario, trace: Path) -> tuple[list[dict], dict]:
    """rackserve on the trace: each planned policy, then every fixed P x D; rows and the planned timelines."""
    runs = {name: {"policy": name, "initial_prefill": 1, "initial_decode": 1} for name in PLANNED}
    runs |= {name: {"policy": "fixed", "initial_prefill": p, "initial_decode": d}
             for name, (p, d) in fixed_runs(base).items()}
    timing = timing_for(base)
    rows, timelines = [], {}
    for name, fields in runs.items():
        r = simulate(with_trace(planned(base, fields), trace), timing=timing)
        rows.append(row("rackserve", name, f"rackserve {name}" if name in PLANNED else "none", r.planner))
        timelines[name] = r.planner["timeline"]
        print(f"rackserve {name:10s} {rows[-1]['sla_attainment']:6.1%}  {rows[-1]['gpu_hours']:.2f} GPU-h", flush=True)
    return rows, timelines


def theirs(base: Scenario, trace: Path, profile: Path, workers: dict, timelines: dict) -> tuple[list[dict], dict]:
    """Dynamo's replay on the trace: every fixed P x D, then rackserve's planner decisions replayed."""
    pl = base.planner
    from rackserve.planner.startup import startup_s
    from rackserve.sim.run import simulator_for, source_factory

    timing = timing_for(base)
    sim = simulator_for(base)(base, timing, base.config.routing.policy, source_factory(base)())
    startup = {role: startup_s(pl, timing, insts[0].layout) for role, insts in (("prefill", sim.prefill),
                                                                                  ("decode", sim.decode))}
    runs = [{"name": name, "initial": [p, d]} for name, (p, d) in fixed_runs(base).items()]
    runs += [{"name": f"{name}-decisions", "initial": [1, 1], "targets": decisions(timelines[name])}
             for name in PLANNED]
    end = base.sim.measure_start_s + base.sim.measure_duration_s
    job = {"trace": str(trace), "profile": str(profile), "workers": workers, "startup_s": startup,
           "sample_s": SAMPLE_S, "window_end_s": end, "runs": runs}
    out = run_dynamo(job)
    check = [{"name": f"{r['name']} (decode KV x{KV_CHECK_X})", "initial": r["initial"]} for r in runs
             if "targets" not in r and r["initial"][1] == 1]
    more = {**workers, "decode_gpu_blocks": workers["decode_gpu_blocks"] * KV_CHECK_X}
    out |= run_dynamo({**job, "workers": more, "runs": check})
    gpus = (workers["prefill_gpus"], workers["decode_gpus"])
    rows = []
    for run in runs + check:
        res = out[run["name"]]
        figures = {**attainment(res["per_request"], pl.ttft_target_s, pl.itl_target_s, end),
                   **gpu_hours([tuple(x) for x in res["timeline"]], gpus, (base.sim.measure_start_s, end))}
        source = run["name"].removesuffix("-decisions")
        planner = f"rackserve {source}'s decisions, replayed" if "targets" in run else "none"
        rows.append(row("dynamo-replay", run["name"], planner, figures))
        print(f"dynamo    {run['name']:16s} {figures['sla_attainment']:6.1%}  {figures['gpu_hours']:.2f} GPU-h "
              f"({res['wall_time_ms']:.0f} ms)", flush=True)
    return rows, startup


def markdown(out: dict) -> str:
    head = "| simulator | run | planner | TTFT | ITL | both | GPU-hours | mean GPUs | requests |"
    lines = [f"Generated by `{out['command']}` from planner_vs_dynamo.json.", "", head, "|" + "---|" * 9]
    for r in out["rows"]:
        lines.append(f"| {r['simulator']} | {r['run']} | {r['planner']} | {r['ttft_attainment']:.1%} | "
                     f"{r['itl_attainment']:.1%} | {r['sla_attainment']:.1%} | {r['gpu_hours']:.2f} | "
                     f"{r['mean_gpus']:.1f} | {r['requests']:,} |")
    for what, why in out["skipped"].items():
        lines += ["", f"Skipped, {what}: {why}"]
    return "\n".join(lines) + "\n"


def headline(rows: list[dict]) -> str:
    by = {(r["simulator"], r["run"]): r for r in rows}
    parts = [f"{sim} {run} {by[(sim, run)]['sla_attainment']:.1%} / {by[(sim, run)]['gpu_hours']:.2f} GPU-h"
             for sim, run in (("rackserve", "load"), ("dynamo-replay", "load-decisions"), ("rackserve", "sla"),
                              ("dynamo-replay", "sla-decisions"), ("rackserve", "fixed-2x1"),
                              ("dynamo-replay", "fixed-2x1")) if (sim, run) in by]
    return "SLA attainment / GPU-hours on the exported load step: " + ", ".join(parts) + "; Dynamo's planner skipped"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default="scenarios/planner-step.yaml")
    args = ap.parse_args()
    base = load_scenario(ROOT / args.scenario)
    requests = load_step_requests(base)
    records = mooncake_records(requests)
    skipped = {}
    with tempfile.TemporaryDirectory(prefix="planner-vs-dynamo-") as tmp:
        trace, profile = Path(tmp) / "load_step.jsonl", Path(tmp) / "rackserve_vr200.npz"
        write_trace(records, trace)
        print(f"trace: {len(records)} requests over {records[-1]['timestamp'] / 1e3:.0f} s", flush=True)
        rows, timelines = ours(base, trace)
        workers = mocker_profile(base, profile)
        why = dynamo_planner_skip()
        skipped["dynamo planner (load and sla) in its replay"] = why or "its modules import: not wired in yet"
        if PEERS_PY.exists():
            dyn_rows, startup = theirs(base, trace, profile, workers, timelines)
            rows += dyn_rows
        else:
            skipped["dynamo replay"] = f"no {PEERS_PY.relative_to(ROOT)}"
            startup = {}
    pl = base.planner
    arrivals = [r.arrival_s for r in requests]
    out = {"command": "python bench/simulator/planner_vs_dynamo.py " + " ".join(sys.argv[1:]),
           "scenario": args.scenario, "ttft_target_s": pl.ttft_target_s, "itl_target_s": pl.itl_target_s,
           "tick_s": pl.tick_s, "window_s": [base.sim.measure_start_s, base.sim.measure_start_s
                                              + base.sim.measure_duration_s],
           "trace": {"requests": len(records), "reference_run": REFERENCE_RUN,
                     "prompt_tokens": sorted({r.prompt_tokens for r in requests}),
                     "output_tokens": sorted({r.output_tokens for r in requests}),
                     "arrivals_per_10s": np.histogram(arrivals, bins=np.arange(0, base.sim.horizon_s + 10, 10))[0]
                     .tolist()},
           "dynamo_workers": workers, "dynamo_startup_s": startup, "sample_s": SAMPLE_S,
           "skipped": skipped, "headline": headline(rows), "rows": rows}
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    OUT.with_suffix(".md").write_text(markdown(out))
    print(markdown(out))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
