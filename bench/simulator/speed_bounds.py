"""What bounds each of issue 33's speed goals, measured rather than argued. For each workload: a first
run (the step-cost memo and router tables empty, as a user's first run), a second run of the same
trace in the same process (memo filled: what the run costs when pricing steps is free), and a third,
also warm, under cProfile, only to count the Python-level and C-level calls made per request. Beside
them, this machine's cost of the cheapest Python function call and of the cheapest C call, and each
goal's budget per request from the goals' own figures (Dynamo's replay in bench/results/simulator/vs_dynamo.json, the
requests of bench/results/simulator/frontier_point.json's point and agentx_speed.json's 10,000-lane run).

What it answers, per goal: how much of a run pricing is (first run less second), what is left when
pricing is free (the second run against the budget), and whether the calls the per-request work makes
could fit the budget at all in CPython (calls x the cheapest call's cost, a floor no restructuring of the
same calls can go under).

Run: .venv/bin/python bench/simulator/speed_bounds.py [--lanes 2048] [--minutes 2]
-> bench/results/simulator/speed_bounds.json and bench/results/simulator/speed_bounds.md (generated from the JSON).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import time
import timeit
from pathlib import Path

from sampler import Sampler
from trees import commit

from rackserve.sim.run import source_factory, timing_for
from rackserve.sim.scenario import load_scenario
from rackserve.sim.simulator import Simulator

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "simulator"
POLICY = "least-uncached-work"
# issue 33's goals
MOONCAKE_WARM_X, MOONCAKE_COLD_X = 0.1, 0.3  # x Dynamo's replay per request
POINT_CPU_S = 60.0  # the 900 s AgentX point at 8,192 lanes on nvl72-vr200
LANES_WALL_S = 30.0  # 10,000 lanes x 10 simulated minutes
DYNAMO_RECORDED_MS = 0.422  # Dynamo 1.6.1's replay on the Mooncake trace, ms/request (issue 51's table), where
# bench/simulator/vs_dynamo.py ran without the peer venv


def mooncake():
    sys.path.insert(0, str(ROOT / "bench" / "simulator"))
    import vs_dynamo

    return vs_dynamo.scenario(vs_dynamo.TRACE, 8)


def agentx(lanes: int, minutes: float):
    sc = load_scenario(ROOT / "scenarios" / "nvl72-vr200.yaml")
    return sc.with_workload(sc.workload.model_copy(update={
        "concurrency": lanes, "duration_s": minutes * 60, "measure_start_s": 0.0, "measure_s": None,
        "warmup_first": False}))


def _run(sc, make, timing) -> tuple[float, float, object, dict]:
    """One run, timed, with where its CPU went (bench/simulator/sampler.py's parts)."""
    source = make()
    with Sampler() as sampler:
        wall, cpu = time.perf_counter(), time.process_time()
        res = Simulator(sc, timing, POLICY, source).run()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall, cpu, res, sampler.report()["parts"]


def calls(stats: pstats.Stats) -> tuple[int, int, dict[str, int]]:
    """(Python-level calls, C-level calls, Python calls by module of rackserve) of a profile."""
    py = c = 0
    by_area: dict[str, int] = {}
    for (path, _line, _name), (_cc, nc, *_rest) in stats.stats.items():  # type: ignore[attr-defined]
        if path == "~":  # a builtin or a C method (cProfile's name for them)
            c += nc
            continue
        py += nc
        rel = path.split("/rackserve/", 1)
        area = rel[1] if len(rel) == 2 and "/.venv" not in path else "outside rackserve"
        by_area[area] = by_area.get(area, 0) + nc
    return py, c, by_area


def measure(name: str, sc) -> dict:
    make, timing = source_factory(sc), timing_for(sc)
    cold_wall, cold_cpu, res, cold_parts = _run(sc, make, timing)
    misses = timing.misses
    warm_wall, warm_cpu, _, warm_parts = _run(sc, make, timing)
    prof = cProfile.Profile()
    source = make()
    prof.enable()
    Simulator(sc, timing, POLICY, source).run()
    prof.disable()
    py, c, by_area = calls(pstats.Stats(prof))
    n = res.arrivals
    return {
        "workload": name, "scenario": sc.name, "requests": n, "step_memo_misses_first_run": misses,
        "first_run": {"wall_s": cold_wall, "cpu_s": cold_cpu, "cpu_us_per_request": 1e6 * cold_cpu / n,
                      "parts": cold_parts},
        "memo_filled_run": {"wall_s": warm_wall, "cpu_s": warm_cpu, "cpu_us_per_request": 1e6 * warm_cpu / n,
                            "parts": warm_parts},
        "pricing_share_of_first_run": 1.0 - warm_cpu / cold_cpu,
        "python_calls_per_request": py / n, "c_calls_per_request": c / n,
        "python_calls_per_request_by_module": {k: v / n for k, v in sorted(by_area.items(), key=lambda kv: -kv[1])[:20]},
    }


def call_costs() -> dict:
    """The cheapest Python function call and the cheapest C call on this machine now (ns, best of 5)."""

    def f():
        return None

    d = {1: 2}
    n = 2_000_000
    py = min(timeit.repeat(f, number=n, repeat=5)) / n
    c = min(timeit.repeat(lambda: d.get(1), number=n, repeat=5)) / n - py  # the lambda's own call taken off
    return {"python_call_ns": 1e9 * py, "c_call_ns": 1e9 * max(c, 0.0)}


def budgets() -> dict:
    """Each goal's budget in us per request, from the goals and the results files the goals are measured in."""
    sim = json.loads((RESULTS / "vs_dynamo.json").read_text())
    if "traces" in sim:  # bench/simulator/vs_dynamo.py's interleaved runs (issue 51): the Mooncake trace's medians
        moon = sim["traces"]["mooncake"]
        dynamo_ms = (moon["dynamo"] or {}).get("wall_ms_per_request", DYNAMO_RECORDED_MS)
        sim = {"ours": [{"warm_ms_per_request": moon["ours"]["warm_wall_ms_per_request"],
                         "fresh_cold_ms_per_request": moon["ours"]["cold_wall_ms_per_request"]}]}
    else:
        dynamo_ms = sim["dynamo_replay"]["ms_per_request"]
    point = [r for r in json.loads((RESULTS / "frontier_point.json").read_text())  # the newest sampled (ours, not a baseline)
             if r["lanes"] == 8192 and r["window_s"] == 900.0 and "profile" in r][-1]
    lanes = json.loads((RESULTS / "agentx_speed.json").read_text())

    def timing_share(row: dict) -> float | None:  # bench/simulator/sampler.py's share of the run itself, where recorded
        parts = row.get("profile", {}).get("parts", {})
        return next((v for k, v in parts.items() if k.startswith("timing model")), None)

    return {
        "mooncake_warm": {"us_per_request": 1e3 * MOONCAKE_WARM_X * dynamo_ms, "now_us_per_request":
                          1e3 * sim["ours"][-1]["warm_ms_per_request"], "source": "bench/results/simulator/vs_dynamo.json (wall)"},
        "mooncake_cold": {"us_per_request": 1e3 * MOONCAKE_COLD_X * dynamo_ms, "now_us_per_request":
                          1e3 * sim["ours"][-1]["fresh_cold_ms_per_request"], "source": "bench/results/simulator/vs_dynamo.json (wall)"},
        "point_900s_8192_lanes": {"us_per_request": 1e6 * POINT_CPU_S / point["requests"],
                                  "now_us_per_request": 1e6 * point["cpu_s"] / point["requests"],
                                  "source": f"bench/results/simulator/frontier_point.json ({point['commit']}, CPU)",
                                  "pricing_share_sampled": timing_share(point)},
        "lanes_10000_x_10min": {"us_per_request": 1e6 * LANES_WALL_S / lanes["requests"],
                                "now_us_per_request": 1e6 * lanes["wall_s"] / lanes["requests"],
                                "source": f"bench/results/simulator/agentx_speed.json ({lanes.get('commit', '?')}, wall)",
                                "pricing_share_sampled": timing_share(lanes)},
    }


# which measured workload stands for each goal's run
PROXY = {"mooncake_warm": "mooncake", "mooncake_cold": "mooncake", "point_900s_8192_lanes": "agentx",
         "lanes_10000_x_10min": "agentx"}


def bounds(goals: dict, runs: dict, cost: dict) -> dict:
    out = {}
    for goal, b in goals.items():
        r = runs[PROXY[goal]]
        floor = (r["python_calls_per_request"] * cost["python_call_ns"] + r["c_calls_per_request"] * cost["c_call_ns"]) / 1e3
        n_calls = r["python_calls_per_request"] + r["c_calls_per_request"]
        per_call_ns = 1e3 * r["memo_filled_run"]["cpu_us_per_request"] / n_calls  # what a call costs with its work
        # the goal's own run's sampled timing-model share where its results file has one, else the proxy's
        share = b.get("pricing_share_sampled")
        if share is None:
            share = r["pricing_share_of_first_run"] if goal != "mooncake_warm" else 0.0
        free = b["now_us_per_request"] * (1.0 - share)  # the goal's run with pricing free
        out[goal] = {**b, "factor_needed": b["now_us_per_request"] / b["us_per_request"],
                     "pricing_share": share, "with_pricing_free_us_per_request": free,
                     "factor_needed_with_pricing_free": free / b["us_per_request"],
                     "calls_per_request": n_calls, "ns_per_call_with_its_work": per_call_ns,
                     "calls_the_budget_allows": 1e3 * b["us_per_request"] / per_call_ns,
                     "call_floor_us_per_request": floor, "call_floor_over_budget": floor / b["us_per_request"]}
    return out


def markdown(result: dict) -> str:
    cost = result["call_costs"]
    lines = [
        "# What bounds each of issue 33's goals (generated by bench/simulator/speed_bounds.py from speed_bounds.json)",
        "",
        f"Commit {result['commit']}; command `{result['command']}`. Cheapest Python call "
        f"{cost['python_call_ns']:.0f} ns, cheapest C call {cost['c_call_ns']:.0f} ns on this machine in this run.",
        "",
        "| workload | requests | first run CPU us/req | memo-filled run CPU us/req | pricing share | Python calls/req |"
        " C calls/req |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["runs"].values():
        lines.append(f"| {r['workload']} ({r['scenario']}) | {r['requests']:,} | {r['first_run']['cpu_us_per_request']:.0f} |"
                     f" {r['memo_filled_run']['cpu_us_per_request']:.0f} | {r['pricing_share_of_first_run']:.0%} |"
                     f" {r['python_calls_per_request']:.0f} | {r['c_calls_per_request']:.0f} |")
    lines += [
        "",
        "| goal | budget us/req | now us/req | factor needed | pricing share | with pricing free | factor left |"
        " calls/req | ns per call | calls the budget allows | empty-call floor us/req |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for goal, b in result["bounds"].items():
        lines.append(f"| {goal} | {b['us_per_request']:.0f} | {b['now_us_per_request']:.0f} | {b['factor_needed']:.1f}x |"
                     f" {b['pricing_share']:.0%} | {b['with_pricing_free_us_per_request']:.0f} |"
                     f" {b['factor_needed_with_pricing_free']:.1f}x | {b['calls_per_request']:.0f} |"
                     f" {b['ns_per_call_with_its_work']:.0f} | {b['calls_the_budget_allows']:.0f} |"
                     f" {b['call_floor_us_per_request']:.0f} |")
    lines += ["", "Where the CPU of each run goes (bench/simulator/sampler.py), in us per request:", ""]
    runs = list(result["runs"].values())
    heads = [f"{r['workload']} {which}" for r in runs for which in ("first", "memo-filled")]
    lines += ["| part | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
    parts = sorted({p for r in runs for w in ("first_run", "memo_filled_run") for p in r[w]["parts"]},
                   key=lambda p: -runs[-1]["memo_filled_run"]["parts"].get(p, 0.0))
    for part in parts:
        cells = [f"{r[w]['parts'].get(part, 0.0) * r[w]['cpu_us_per_request']:.0f}"
                 for r in runs for w in ("first_run", "memo_filled_run")]
        lines.append(f"| {part} | " + " | ".join(cells) + " |")
    top = runs[-1]["python_calls_per_request_by_module"]
    lines += ["", f"Python calls per request by module ({runs[-1]['workload']}, memo filled; the top 12):", "",
              "| module | calls per request |", "|---|---:|"]
    lines += [f"| {m} | {v:.1f} |" for m, v in list(top.items())[:12]]
    lines += [
        "",
        "Budget: the goal over the requests of the goal's own run (its source named in the JSON). Pricing share: the",
        "timing model's share of the goal's own run by bench/simulator/sampler.py where its results file records one (the point,",
        "the 10,000-lane run), else the first run's CPU less the memo-filled run's over the first run's (Mooncake cold;",
        "the warm goal is measured warm: none). With pricing free: the goal's figure less that share. Calls per request:",
        "Python-level and C-level calls (cProfile's count) of the workload standing for the goal's run (the AgentX one,",
        "fewer lanes and minutes on the same scenario, for the point and the 10,000-lane run); ns per call: its",
        "memo-filled run's CPU over those calls, each with its share of the work; calls the budget allows: the budget",
        "at that cost. Empty-call floor: the calls at the cheapest Python and C call's cost, a floor no reordering of",
        "the same calls goes under. Where the calls the budget allows are a small fraction of the calls made, no",
        "pruning of the Python per-request work reaches the goal: the work itself must be compiled.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", type=int, default=2048)
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--out", type=Path, default=RESULTS / "speed_bounds.json")
    args = ap.parse_args()
    runs = {"mooncake": measure("mooncake", mooncake()),
            "agentx": measure(f"agentx {args.lanes} lanes x {args.minutes:g} min", agentx(args.lanes, args.minutes))}
    cost = call_costs()
    goals = budgets()
    result = {"command": f".venv/bin/python bench/simulator/speed_bounds.py --lanes {args.lanes} --minutes {args.minutes:g}",
              "commit": commit(), "load_average_1m": os.getloadavg()[0], "call_costs": cost, "runs": runs,
              "bounds": bounds(goals, runs, cost)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    md = markdown(result)
    args.out.with_suffix(".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
