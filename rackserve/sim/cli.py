"""`rackserve sim SCENARIO ...` and `rackserve sim sweep ...`: the simulator's command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rackserve.sim.report import plot_throughput_vs_speed, plot_ttft_cdf, summary_table, write_json
from rackserve.sim.run import run_policies, with_concurrency, with_trace
from rackserve.sim.scenario import load_scenario

console = Console()
run_app = typer.Typer(add_completion=False)
sweep_app = typer.Typer(add_completion=False)
PROGRESS_EVERY = 200  # requests between progress-bar refreshes


def _csv(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def _load(scenario: Path, trace: Path | None, concurrency: int | None, duration: float | None):
    try:
        sc = load_scenario(scenario)
        if trace is not None:
            sc = with_trace(sc, trace)
        if concurrency is not None:
            sc = with_concurrency(sc, concurrency)
        if duration is not None:
            sc = sc.with_workload(sc.workload.model_copy(update={"duration_s": duration}))
        return sc
    except (ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from None


@run_app.command()
def simulate(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML (scenarios/*.yaml)")],
    policy: Annotated[str, typer.Option(help="comma-separated routing policies, run side by side")] = "least-uncached-work",
    trace: Annotated[Path | None, typer.Option(help="replace the workload: Mooncake or AgentX conversation JSONL (.gz too)")] = None,
    out: Annotated[Path, typer.Option(help="folder for JSON and plots")] = Path("out/sim"),
    concurrency: Annotated[int | None, typer.Option(help="override the closed-loop concurrency")] = None,
    duration: Annotated[float | None, typer.Option(help="override the workload's duration_s")] = None,
) -> None:
    """Simulate SCENARIO once per policy on the same arrivals; print a summary, write JSON + plots."""
    sc = _load(scenario, trace, concurrency, duration)
    policies = _csv(policy)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as bar:

        def progress(name: str):
            task = bar.add_task(name, total=None)

            def update(done: int, arrivals: int) -> None:
                if done % PROGRESS_EVERY == 0:
                    bar.update(task, completed=done, total=arrivals)

            return update

        try:
            results = run_policies(sc, policies, progress=progress)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    console.print(summary_table(results))
    out.mkdir(parents=True, exist_ok=True)
    write_json(results, out / f"{sc.name}.json", {"scenario": sc.name, "policies": policies})
    plot_ttft_cdf(results, out / f"{sc.name}-ttft-cdf.png")
    plot_throughput_vs_speed(results, out / f"{sc.name}-throughput-vs-speed.png")
    console.print(f"wrote {out}/{sc.name}.json and plots")


@sweep_app.command()
def sweep(
    scenarios: Annotated[list[Path], typer.Argument(help="deployment scenarios (closed-loop workloads)")],
    concurrency: str = typer.Option("100,400,1600", help="comma-separated concurrencies"),
    policy: Annotated[str, typer.Option(help="comma-separated routing policies")] = "least-uncached-work",
    duration: Annotated[float | None, typer.Option(help="override each workload's duration_s")] = None,
    out: Annotated[Path, typer.Option(help="folder for JSON and the curve plot")] = Path("out/sim-sweep"),
    num_cpus: Annotated[int, typer.Option(help="Ray CPUs (tasks in parallel)")] = 2,
) -> None:
    """Fan a (scenario x concurrency x policy) grid out as Ray tasks; write the throughput/GPU vs
    tok/s/user curve with its peak."""
    from rackserve.sim.sweep import curves, grid, plot_curves, run_grid

    for path in scenarios:
        _load(path, None, None, None)  # validate before starting Ray
    points = grid([str(p) for p in scenarios], [int(c) for c in _csv(concurrency)], _csv(policy), duration)
    console.print(f"sweeping {len(points)} runs on Ray ({num_cpus} CPUs)")
    rows = run_grid(points, num_cpus=num_cpus)
    curve_rows = curves(rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps({"runs": rows, "curves": curve_rows}, indent=2, default=float) + "\n")
    plot_curves(curve_rows, out / "sweep-curve.png")
    for c in curve_rows:
        pk = c["peak"]
        console.print(f"{c['scenario']} {c['policy']}: peak {pk['throughput_per_gpu']:,.0f} tok/s/GPU at concurrency "
                      f"{pk['concurrency']} (P50 {pk['user_tps_p50']:.1f} tok/s/user)")
    console.print(f"wrote {out}/sweep.json and sweep-curve.png")


SIM_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def sim(ctx: typer.Context) -> None:
    """Offline simulator: `rackserve sim SCENARIO [--policy a,b] [--trace F] [--out D]` or `rackserve sim sweep ...`."""
    args = list(ctx.args)
    if args and args[0] == "sweep":
        sweep_app(args[1:], prog_name="rackserve sim sweep")
    else:
        run_app(args, prog_name="rackserve sim")


def register(app: typer.Typer) -> None:
    """Add `sim` to the top-level rackserve app."""
    app.command("sim", context_settings=SIM_CONTEXT)(sim)
