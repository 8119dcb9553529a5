"""`rackserve sim sweep SCENARIO...`: InferenceX-style curves, concurrency refined by itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from rackserve.sim.cli_args import (
    NoStepStoreOption,
    StepStoreOption,
    console,
    csv_list,
    load_with_overrides,
    use_step_store,
)

sweep_app = typer.Typer(add_completion=False)
SCHEMA = "rackserve.sim.sweep/1"


def in_process(points):
    """Run points here, one after the other (--num-cpus 0: no Ray)."""
    from rackserve.sim.sweep import run_point

    return [run_point(p) for p in points]


def sweep_payload(rows: list[dict], targets: list[float], base_scenario: str | None = None) -> dict:
    from rackserve.sim.sweep import curves, ratios

    curve_rows = curves(rows, targets)
    return {"schema": SCHEMA, "target_tps_user": targets, "curves": curve_rows,
            "ratios": ratios(curve_rows, targets, base_scenario), "runs": rows}


@sweep_app.command()
def sweep(
    scenarios: Annotated[list[Path], typer.Argument(help="deployment scenarios (closed-loop workloads)")],
    concurrency: Annotated[str, typer.Option(help="fixed comma-separated lanes (default: refine by itself)")] = "",
    min_lanes: Annotated[int, typer.Option(help="refinement: lowest concurrency")] = 1,
    max_lanes: Annotated[int, typer.Option(help="refinement: highest concurrency")] = 20_000,
    rounds: Annotated[int, typer.Option(help="refinement: bisection rounds where the curve bends")] = 2,
    policy: Annotated[str, typer.Option(help="comma-separated routing policies")] = "least-uncached-work",
    target_tps_user: Annotated[str, typer.Option(help="comma-separated tok/s/user to read the frontiers at")] = "",
    duration: Annotated[float | None, typer.Option(help="override each workload's duration_s")] = None,
    measure_start: Annotated[float | None, typer.Option(help="override the trace workload's measure_start_s")] = None,
    out: Annotated[Path, typer.Option(help="folder for sweep.json and sweep-frontier.png")] = Path("out/sim-sweep"),
    num_cpus: Annotated[int, typer.Option(help="Ray CPUs (tasks in parallel); 0 = in this process")] = 2,
    step_store: StepStoreOption = None,
    no_step_store: NoStepStoreOption = False,
) -> None:
    """Sweep concurrency per scenario and policy (Ray tasks); write the Pareto frontiers of
    throughput/GPU vs tok/s/user, the peak, throughput at the targets and the ratios between scenarios."""
    from rackserve.sim.sweep import RayRunner, adaptive, grid
    from rackserve.sim.sweep_plot import plot_frontiers

    use_step_store(step_store, out, not no_step_store)  # before Ray starts: its workers inherit it
    for path in scenarios:
        load_with_overrides(path, None, None, None)  # validate before starting Ray
    targets = [float(t) for t in csv_list(target_tps_user)]
    paths, policies = [str(p) for p in scenarios], csv_list(policy)
    runner = RayRunner(num_cpus) if num_cpus > 0 else None
    run = runner if runner is not None else in_process
    try:
        if concurrency:
            rows = run(grid(paths, [int(c) for c in csv_list(concurrency)], policies, duration, measure_start))
        else:
            rows = adaptive(paths, policies, run, min_lanes, max_lanes, rounds, max(num_cpus, 1), duration,
                            measure_start)
    finally:
        if runner is not None:
            runner.close()
    payload = sweep_payload(rows, targets)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(payload, indent=1, default=float) + "\n")
    plot_frontiers(payload["curves"], out / "sweep-frontier.png", targets)
    _print(payload)
    console.print(f"wrote {out}/sweep.json and sweep-frontier.png")


def _print(payload: dict) -> None:
    for c in payload["curves"]:
        pk = c["peak"]
        at = ", ".join(f"{t} tok/s/user: {_num(v['p90'])}" for t, v in c["at_target"].items())
        console.print(f"{c['scenario']} {c['policy']}: peak {pk['throughput_per_gpu']:,.0f} tok/s/GPU at "
                      f"{pk['concurrency']} lanes (P90 {c['interactivity']} {pk['user_tps_p90']:.1f} tok/s/user)"
                      f"{'; at P90 ' + at if at else ''}")
    for r in payload["ratios"]:
        ratio = "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        console.print(f"{r['policy']} at {r['target_tps_user']:g} tok/s/user: {r['other']} / {r['base']} = {ratio}")


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.0f}"
