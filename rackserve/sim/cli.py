"""`rackserve sim SCENARIO ...` and `rackserve sim sweep ...`: the simulator's command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rackserve.sim.cli_args import console, csv_list, load_with_overrides
from rackserve.sim.report import plot_throughput_vs_speed, plot_ttft_cdf, summary_table, write_json
from rackserve.sim.run import run_policies

run_app = typer.Typer(add_completion=False)
PROGRESS_EVERY = 200  # requests between progress-bar refreshes


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
    sc = load_with_overrides(scenario, trace, concurrency, duration)
    policies = csv_list(policy)
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


SIM_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def sim(ctx: typer.Context) -> None:
    """Offline simulator: `rackserve sim SCENARIO [--policy a,b] [--trace F] [--out D]`, `rackserve sim sweep ...`
    or `rackserve sim explain A.yaml B.yaml --target-tps-user X`."""
    args = list(ctx.args)
    if args and args[0] == "sweep":
        from rackserve.sim.cli_sweep import sweep_app

        sweep_app(args[1:], prog_name="rackserve sim sweep")
    elif args and args[0] == "explain":
        from rackserve.sim.cli_explain import explain_app

        explain_app(args[1:], prog_name="rackserve sim explain")
    else:
        run_app(args, prog_name="rackserve sim")


def register(app: typer.Typer) -> None:
    """Add `sim` to the top-level rackserve app."""
    app.command("sim", context_settings=SIM_CONTEXT)(sim)
