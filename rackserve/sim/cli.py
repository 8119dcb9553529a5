"""`rackserve sim SCENARIO ...` and `rackserve sim sweep ...`: the simulator's command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rackserve.sim.cli_args import (
    NoStepStoreOption,
    StepStoreOption,
    console,
    csv_list,
    load_with_overrides,
    use_step_store,
)
from rackserve.sim.planner_plot import plot_planner_timeline
from rackserve.sim.progress import ProgressTick
from rackserve.sim.report import (
    plot_pool_trace,
    plot_throughput_vs_speed,
    plot_ttft_cdf,
    summary_table,
    write_json,
)
from rackserve.sim.run import keep_steps, run_policies, shared_timing

run_app = typer.Typer(add_completion=False)
INVALID_EXIT = 3  # `rackserve sim`: a run failed AgentX's validity checks (rackserve/sim/validity.py)


def progress_bar(bar: Progress, name: str):
    """A bar for one run: requests done of the trace's total, or (closed loop, where the count is
    not known up front) simulated seconds of the run's end; the run's last tick ends the bar at its
    true figure, which stops its clock."""
    task = bar.add_task(name, total=None)

    def update(t: ProgressTick) -> None:
        if t.total is not None:
            completed, total, what = t.done, t.total, f"{name} (requests)"
        else:
            completed, total = t.now_s, t.end_s
            what = f"{name} (simulated s; {t.done:,} requests done)"
        if t.final:  # the run is over: the bar reads what was reached and stops
            completed = total = t.done if t.total is not None else t.now_s
            if t.in_flight:
                what += f", {t.in_flight:,} in flight at the end"
        bar.update(task, completed=completed, total=total, description=what)

    return update


@run_app.command()
def simulate(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML (scenarios/*.yaml)")],
    policy: Annotated[str | None, typer.Option(
        help="comma-separated routing policies, run side by side (default: the scenario's routing.policy)")] = None,
    trace: Annotated[Path | None, typer.Option(help="replace the workload: Mooncake or AgentX conversation JSONL (.gz too)")] = None,
    out: Annotated[Path, typer.Option(help="folder for JSON and plots")] = Path("out/sim"),
    concurrency: Annotated[int | None, typer.Option(help="override the closed-loop concurrency")] = None,
    duration: Annotated[float | None, typer.Option(help="override the workload's duration_s")] = None,
    allow_invalid: Annotated[bool, typer.Option(
        help="exit 0 even when a run fails AgentX's validity checks (overflow > 1%, coverage < 95%)")] = False,
    step_store: StepStoreOption = None,
    no_step_store: NoStepStoreOption = False,
) -> None:
    """Simulate SCENARIO once per policy on the same arrivals; print a summary, write JSON + plots.
    Exits 3 when a run is invalid by AgentX's rules, unless --allow-invalid."""
    use_step_store(step_store, out, not no_step_store)
    sc = load_with_overrides(scenario, trace, concurrency, duration)
    policies = csv_list(policy) if policy else [sc.config.routing.policy]
    timing = shared_timing(sc)  # with the step store's entries, where one is configured
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as bar:
        try:
            results = run_policies(sc, policies, timing, progress=lambda name: progress_bar(bar, name))
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    keep_steps(sc, timing)
    console.print(summary_table(results))
    out.mkdir(parents=True, exist_ok=True)
    write_json(results, out / f"{sc.name}.json", {"scenario": sc.name, "policies": policies})
    plot_ttft_cdf(results, out / f"{sc.name}-ttft-cdf.png")
    plot_throughput_vs_speed(results, out / f"{sc.name}-throughput-vs-speed.png")
    if any(r.pool_trace.get("t_s") for r in results):  # an aggregated run has no pool
        plot_pool_trace(results, out / f"{sc.name}-pool.png")
    if any(r.planner for r in results):  # a scenario with a planner: section
        plot_planner_timeline(results, out / f"{sc.name}-planner.png")
        for r in results:
            p = r.planner
            console.print(f"planner {p['policy']} ({r.policy}): SLA attainment {p['sla_attainment']:.1%} "
                          f"(TTFT {p['ttft_attainment']:.1%}, ITL {p['itl_attainment']:.1%}), "
                          f"{p['gpu_hours']:.2f} GPU-hours, mean {p['mean_gpus']:.1f} GPUs")
    console.print(f"wrote {out}/{sc.name}.json and plots")
    invalid = [r for r in results if not r.valid]
    for r in invalid:
        console.print(f"[red]invalid run ({r.policy}): {'; '.join(r.invalid_reasons)}[/red]")
    if invalid and not allow_invalid:
        raise typer.Exit(code=INVALID_EXIT)


SIM_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def sim(ctx: typer.Context) -> None:
    """Offline simulator: `rackserve sim SCENARIO [--policy a,b] [--trace F] [--out D]`, `rackserve sim sweep ...`,
    `rackserve sim frontier RACK.yaml --out D`, `rackserve sim sensitivity RACK.yaml [--versus B.yaml]` or `rackserve sim explain A.yaml B.yaml --target-tps-user X`."""
    args = list(ctx.args)
    if args and args[0] == "sweep":
        from rackserve.sim.cli_sweep import sweep_app

        sweep_app(args[1:], prog_name="rackserve sim sweep")
    elif args and args[0] == "frontier-docs":
        from rackserve.search.cli import docs_app

        docs_app(args[1:], prog_name="rackserve sim frontier-docs")
    elif args and args[0] == "frontier-explain":
        from rackserve.search.cli import explain_app as frontier_explain_app

        frontier_explain_app(args[1:], prog_name="rackserve sim frontier-explain")
    elif args and args[0] == "frontier":
        from rackserve.search.cli import frontier_app

        frontier_app(args[1:], prog_name="rackserve sim frontier")
    elif args and args[0] == "sensitivity":
        from rackserve.search.cli import sensitivity_app

        sensitivity_app(args[1:], prog_name="rackserve sim sensitivity")
    elif args and args[0] == "explain":
        from rackserve.sim.cli_explain import explain_app

        explain_app(args[1:], prog_name="rackserve sim explain")
    else:
        run_app(args, prog_name="rackserve sim")


def register(app: typer.Typer) -> None:
    """Add `sim` to the top-level rackserve app."""
    app.command("sim", context_settings=SIM_CONTEXT)(sim)
