"""`rackserve sim explain A.yaml B.yaml --target-tps-user X`: where a rack-over-rack ratio comes from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import typer  # noqa: E402
import yaml  # noqa: E402
from rich.table import Table  # noqa: E402

from rackserve.sim.cli_args import (  # noqa: E402
    NoStepStoreOption,
    StepStoreOption,
    console,
    csv_list,
    load_with_overrides,
    use_step_store,
)
from rackserve.sim.cli_sweep import in_process  # noqa: E402

explain_app = typer.Typer(add_completion=False)
SCHEMA = "rackserve.sim.explain/1"


@explain_app.command()
def explain(
    a: Annotated[Path, typer.Argument(help="scenario A (the base)")],
    b: Annotated[Path, typer.Argument(help="scenario B")],
    target_tps_user: Annotated[float, typer.Option(
        help="interactivity (tok/s/user, P90 E2E-normalized as AgentX reads it) to price each step at")],
    concurrency: Annotated[str, typer.Option(help="fixed lanes per step (default: refine by itself)")] = "",
    max_lanes: Annotated[int, typer.Option(help="refinement: highest concurrency")] = 20_000,
    duration: Annotated[float | None, typer.Option(help="override each workload's duration_s")] = None,
    measure_start: Annotated[float | None, typer.Option(help="override the trace workload's measure_start_s")] = None,
    jobs: Annotated[int, typer.Option(min=1, help="points simulated at once (local processes)")] = 1,
    first: Annotated[str, typer.Option(help="comma-separated factors to walk first, e.g. 'routing policy'")] = "",
    out: Annotated[Path, typer.Option(help="folder for the steps' scenarios, explain.json and the waterfall")] = Path(
        "out/sim-explain"),
    step_store: StepStoreOption = None,
    no_step_store: NoStepStoreOption = False,
) -> None:
    """Walk from A to B one factor at a time; report throughput/GPU at the target after each step."""
    from rackserve.sim.explain import read_scenario_dict, walk
    from rackserve.sim.sweep import adaptive, grid

    use_step_store(step_store, out, not no_step_store)  # before the worker processes start: they inherit it
    for path in (a, b):
        load_with_overrides(path, None, None, None)
    try:
        steps = walk(read_scenario_dict(a), read_scenario_dict(b), [f.strip() for f in first.split(",") if f.strip()])
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--first") from None
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, step in enumerate(steps):
        path = out / f"step{i}.yaml"
        path.write_text(yaml.safe_dump(step.scenario, sort_keys=False))
        load_with_overrides(path, None, None, None)
        paths.append(str(path))
    run = in_process if jobs == 1 else in_processes(jobs)
    if concurrency:  # every step's points at once, so --jobs runs steps side by side
        runs = run([p for s, path in zip(steps, paths, strict=True)
                    for p in grid([path], [int(c) for c in csv_list(concurrency)], [_policy(s.scenario)],
                                  duration, measure_start)])
    else:
        runs = [r for s, path in zip(steps, paths, strict=True)
                for r in adaptive([path], [_policy(s.scenario)], run, 1, max_lanes, 0, max(jobs, 1), duration,
                                  measure_start)]
    rows = [step_row(i, s, path, [r for r in runs if r["scenario_path"] == path], target_tps_user)
            for i, (s, path) in enumerate(zip(steps, paths, strict=True))]
    payload = {"schema": SCHEMA, "a": str(a), "b": str(b), "target_tps_user": target_tps_user, "steps": rows}
    (out / "explain.json").write_text(json.dumps(payload, indent=1, default=float) + "\n")
    plot_waterfall(rows, target_tps_user, out / "explain-waterfall.png")
    console.print(table(rows, target_tps_user))
    console.print(f"wrote {out}/explain.json and explain-waterfall.png")


def step_row(i: int, step, path: str, runs: list[dict], target: float) -> dict:
    """One step's line of explain.json: its frontier priced at the target, and what its runs cost."""
    from rackserve.sim.sweep import curves

    (c,) = curves(runs, [target])
    value = c["at_target"][f"{target:g}"]["p90"]  # AgentX's headline: P90 E2E-normalized
    console.print(f"step {i} {step.factor}: {_num(value)} tok/s/GPU at {target:g} tok/s/user")
    return {"step": i, "factor": step.factor, "change": step.change, "scenario": path,
            "throughput_per_gpu_at_target": value, "peak_throughput_per_gpu": c["peak"]["throughput_per_gpu"],
            "frontier_p50": c["frontier_p50"], "points": c["points"],
            "cpu_s": sum(r.get("point_cpu_s", r.get("cpu_s", 0.0)) for r in runs),
            "wall_s": sum(r.get("wall_s", 0.0) for r in runs)}


def in_processes(jobs: int):
    """A runner over `jobs` local worker processes (no Ray: nothing to lock or tear down)."""

    def run(points):
        from concurrent.futures import ProcessPoolExecutor

        from rackserve.sim.sweep import run_point

        with ProcessPoolExecutor(max_workers=min(jobs, max(len(points), 1))) as pool:
            return list(pool.map(run_point, points))

    return run


def _policy(scenario: dict) -> str:
    return (scenario.get("routing") or {}).get("policy", "least-uncached-work")


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.0f}"


def table(rows: list[dict], target: float) -> Table:
    t = Table(title=f"throughput/GPU at {target:g} tok/s/user, one factor at a time")
    for col in ("step", "factor", "change", "tok/s/GPU", "x previous", "x A"):
        t.add_column(col)
    base = rows[0]["throughput_per_gpu_at_target"]
    prev = base
    for r in rows:
        v = r["throughput_per_gpu_at_target"]
        t.add_row(str(r["step"]), r["factor"], r["change"], _num(v), _ratio(v, prev), _ratio(v, base))
        prev = v
    return t


def _ratio(v: float | None, ref: float | None) -> str:
    return "n/a" if v is None or not ref else f"{v / ref:.2f}"


def plot_waterfall(rows: list[dict], target: float, path: Path) -> None:
    """Bars from A's value: each step's change floats on the previous total; the last bar is B."""
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows)), 4.5))
    prev = 0.0
    for i, r in enumerate(rows):
        v = r["throughput_per_gpu_at_target"] or 0.0
        if i == 0:
            ax.bar(i, v, color="tab:blue")
        else:
            ax.bar(i, v - prev, bottom=prev, color="tab:green" if v >= prev else "tab:red")
        ax.annotate(f"{v:,.0f}", (i, v), ha="center", va="bottom", fontsize=7)
        prev = v
    ax.set_xticks(range(len(rows)), [r["factor"] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"tok/s/GPU at {target:g} tok/s/user")
    ax.set_title("From A to B, one factor at a time")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
