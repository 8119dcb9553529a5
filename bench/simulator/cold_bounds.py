"""What bounds issue 51's goals (a first run, cold, <= 1.0x Dynamo's replay on the Mooncake trace and <= 0.5x
on the agentic one; warm no worse), measured: per trace, a fresh process's cold run and then a warm run of the
same trace (bench/simulator/vs_dynamo.py's cold_then_warm), each under a sampling profiler (bench/simulator/sampler.py's SIGPROF, 2 ms of
CPU), the CPU split by part, the pricing of a step split further by the innermost frame of the sample:

- compiled kernels: timing/pricer.py's wrappers and the C they call (timing/_pricer.c);
- token bundles: under step_cost.token_bundle (projections, MoE, LM head, host work: per-rank token counts);
- pricing orchestration: the rest of timing/ (plans, batch halves, Prepared sums, assembly of a StepCost,
  speculative and overlap combination), the Python around the kernels.

Run: .venv/bin/python bench/simulator/cold_bounds.py [--rounds 3]  -> bench/results/simulator/cold_bounds.{json,md}
Budgets: Dynamo's CPU per request from bench/results/simulator/vs_dynamo.json where the peer ran, else issue 51's recorded
figures (wall, Dynamo 1.6.1 on this kind of machine): 0.422 (Mooncake) and 1.555 ms (agentic).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "simulator"
sys.path.insert(0, str(ROOT / "bench" / "simulator"))

import sampler  # noqa: E402
import vs_dynamo  # noqa: E402

PRICING = "timing model: pricing a step (memo misses, router tables)"
SUB = ("compiled kernels (timing/_pricer.c + pricer.py wrappers)", "token bundles (step_cost.token_bundle)",
       "pricing orchestration (rest of timing/: Python)")
RECORDED_DYNAMO_MS = {"mooncake": 0.422, "agentx": 1.555}  # issue 51's table (wall, ms per request)
GOAL_X = vs_dynamo.COLD_GOAL_X


class PricingSampler(sampler.Sampler):
    """bench/simulator/sampler.py's Sampler, its timing-model samples split into SUB."""

    def __init__(self, interval_s: float) -> None:
        super().__init__(interval_s)
        self.sub: Counter[str] = Counter()

    def _tick(self, signum, frame) -> None:
        super()._tick(signum, frame)
        f, innermost, bundle = frame, None, False
        while f is not None:
            path = f.f_code.co_filename
            if path.startswith(sampler.ROOT) and "/bench/" not in path and "/.venv" not in path:
                innermost = innermost or path
                bundle = bundle or f.f_code.co_name == "token_bundle"
            f = f.f_back
        if innermost is None or "/rackserve/timing/" not in innermost:
            return
        self.sub[SUB[0] if innermost.endswith("timing/pricer.py") else SUB[1] if bundle else SUB[2]] += 1


def sampled(trace: str, group: int) -> dict:
    """cold_then_warm's two runs, each sampled: CPU us per request by part (pricing split into SUB)."""
    import time

    from rackserve.sim.run import source_factory, timing_for
    from rackserve.sim.simulator import Simulator

    sc = vs_dynamo.scenario(Path(trace), group)
    make, timing = source_factory(sc), timing_for(sc)
    out: dict = {}
    for which in ("cold", "warm"):
        source = make()
        misses = timing.misses
        with PricingSampler(0.002) as s:
            cpu = time.process_time()
            res = Simulator(sc, timing, "least-uncached-work", source).run()
            cpu = time.process_time() - cpu
        n, k = res.arrivals, max(s.samples, 1)
        us = 1e6 * cpu / n
        parts = {p: us * v for p, v in s.report()["parts"].items()}
        parts.pop(PRICING, None)
        out[which] = {"cpu_us_per_request": us, "misses": timing.misses - misses,
                      "parts_us_per_request": {**{p: us * s.sub[p] / k for p in SUB}, **parts}}
    out["requests"] = res.arrivals
    return out


def fresh(trace: Path, group: int) -> dict:
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'bench' / 'simulator')!r}); import cold_bounds as b; "
            f"print(json.dumps(b.sampled({str(trace)!r}, {group})))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RACKSERVE_STEP_STORE", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=1800, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def dynamo_ms(name: str) -> tuple[float, str]:
    path = RESULTS / "vs_dynamo.json"
    if path.exists():
        data = json.loads(path.read_text())
        d = data.get("traces", {}).get(name, {}).get("dynamo")
        if d:
            return d["cpu_ms_per_request"], f"bench/results/simulator/vs_dynamo.json ({data.get('commit')}, CPU)"
    return RECORDED_DYNAMO_MS[name], "issue 51's table (Dynamo 1.6.1, wall; the peer venv is absent here)"


def median_run(runs: list[dict]) -> dict:
    """The run with the median cold CPU (its parts with it)."""
    return sorted(runs, key=lambda r: r["cold"]["cpu_us_per_request"])[len(runs) // 2]


def bounds(name: str, runs: list[dict]) -> dict:
    r = median_run(runs)
    cold, warm = r["cold"], r["warm"]
    budget_ms, source = dynamo_ms(name)
    budget_us = 1e3 * budget_ms * GOAL_X[name]
    pricing = cold["cpu_us_per_request"] - warm["cpu_us_per_request"]
    sub = {p: cold["parts_us_per_request"][p] - warm["parts_us_per_request"].get(p, 0.0) for p in SUB}
    return {
        "trace": name, "requests": r["requests"], "rounds": len(runs),
        "cold_cpu_us_per_request_runs": [x["cold"]["cpu_us_per_request"] for x in runs],
        "warm_cpu_us_per_request_runs": [x["warm"]["cpu_us_per_request"] for x in runs],
        "cold_cpu_us_per_request": statistics.median(x["cold"]["cpu_us_per_request"] for x in runs),
        "warm_cpu_us_per_request": statistics.median(x["warm"]["cpu_us_per_request"] for x in runs),
        "dynamo_ms_per_request": budget_ms, "dynamo_source": source, "goal_x": GOAL_X[name],
        "budget_us_per_request": budget_us,
        "factor_needed": cold["cpu_us_per_request"] / budget_us,
        "step_memo_misses_cold": cold["misses"],
        "pricing_us_per_request": pricing, "pricing_us_per_miss": pricing * r["requests"] / max(cold["misses"], 1),
        "pricing_split_us_per_request": sub,
        "warm_over_budget": warm["cpu_us_per_request"] / budget_us,
        "median_run": r,
    }


def markdown(result: dict) -> str:
    lines = [
        "# What bounds issue 51's cold-run goals (generated by bench/simulator/cold_bounds.py from cold_bounds.json)",
        "", f"Commit {result['commit']}; command `{result['command']}`; load average {result['load_average_1m']}.",
        "CPU per simulated request, a fresh process's cold run then its warm run, median of the rounds.", "",
        "| trace | requests | cold us | warm us | Dynamo us (source) | goal | budget us | factor needed |"
        " pricing us (cold - warm) | misses | pricing us per miss | warm / budget |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for b in result["bounds"].values():
        lines.append(f"| {b['trace']} | {b['requests']:,} | {b['cold_cpu_us_per_request']:.0f} |"
                     f" {b['warm_cpu_us_per_request']:.0f} | {1e3 * b['dynamo_ms_per_request']:.0f} ({b['dynamo_source']}) |"
                     f" {b['goal_x']}x | {b['budget_us_per_request']:.0f} | {b['factor_needed']:.2f}x |"
                     f" {b['pricing_us_per_request']:.0f} | {b['step_memo_misses_cold']:,} |"
                     f" {b['pricing_us_per_miss']:.0f} | {b['warm_over_budget']:.2f}x |")
    lines += ["", "Pricing (cold less warm, by the sampler) split by where its CPU goes, us per request:", "",
              "| trace | " + " | ".join(SUB) + " |", "|---|" + "---:|" * len(SUB)]
    for b in result["bounds"].values():
        lines.append(f"| {b['trace']} | " + " | ".join(f"{b['pricing_split_us_per_request'][p]:.0f}" for p in SUB) + " |")
    lines += ["", "Where the rest of a run goes (the median run's warm run, us per request):", "",
              "| part | " + " | ".join(result["bounds"]) + " |", "|---|" + "---:|" * len(result["bounds"])]
    parts = sorted({p for b in result["bounds"].values() for p in b["median_run"]["warm"]["parts_us_per_request"]})
    for p in parts:
        lines.append(f"| {p} | " + " | ".join(f"{b['median_run']['warm']['parts_us_per_request'].get(p, 0.0):.0f}"
                                            for b in result["bounds"].values()) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--group", type=int, default=8)
    args = ap.parse_args()
    traces = {name: make() for name, make in vs_dynamo.TRACES.items()}
    runs: dict[str, list[dict]] = {name: [] for name in traces}
    for _ in range(args.rounds):  # interleaved, so both traces see the same load
        for name, trace in traces.items():
            runs[name].append(fresh(trace, args.group))
    result = {"command": f".venv/bin/python bench/simulator/cold_bounds.py --rounds {args.rounds}", "commit": vs_dynamo._commit(),
              "load_average_1m": round(os.getloadavg()[0], 2),
              "bounds": {name: bounds(name, rs) for name, rs in runs.items()}}
    out = RESULTS / "cold_bounds.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    md = markdown(result)
    out.with_suffix(".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
