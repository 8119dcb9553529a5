"""`rackserve sim frontier RACK.yaml ...`: search a rack's deployments, write frontier.json + plot."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from rackserve.search.frontier import read_previous, search, speed_key, with_trace
from rackserve.search.plot import frontier_table, plot_frontier
from rackserve.search.rack import load_rack
from rackserve.sim.cli_args import console, csv_list

frontier_app = typer.Typer(add_completion=False)


@frontier_app.command()
def frontier(
    rack: Annotated[Path, typer.Argument(help="rack file (scenarios/racks/*.yaml): hardware, GPUs, workload, space")],
    out: Annotated[Path, typer.Option(help="folder for frontier.json and frontier.png")] = Path("out/frontier"),
    trace: Annotated[Path | None, typer.Option(help="replay another conversation file (AgentX format)")] = None,
    targets: Annotated[str, typer.Option(help="comma-separated tok/s/user targets (default: the rack's)")] = "",
    percentile: Annotated[str, typer.Option(help="p90 (AgentX's headline: the slow tail) or p50")] = "p90",
    interactivity: Annotated[str, typer.Option(help="e2e (AgentX: TTFT counts) or itl (1/TPOT)")] = "e2e",
    budget_cpu_s: Annotated[float | None, typer.Option(help="CPU seconds the replays may take (predicted)")] = None,
    ray_address: Annotated[str | None, typer.Option(help="a Ray cluster to run the replays on (default: local)")] = None,
    num_cpus: Annotated[int | None, typer.Option(help="local Ray CPUs (default: all)")] = None,
    window_s: Annotated[float | None, typer.Option(help="replay window in simulated s (default: the rack's, 900)")] = None,
    max_point_cpu_s: Annotated[float | None, typer.Option(
        help="a replay predicted to cost more gets a shorter window (>= 120 s), recorded on the point")] = None,
    screen_only: Annotated[bool, typer.Option(help="screen every configuration, replay nothing")] = False,
    resume: Annotated[bool, typer.Option(help="keep the replayed points of OUT/frontier.json, run only the rest")] = False,
) -> None:
    """Screen every configuration, confirm the envelope by replay, report it as AgentX reads it."""
    try:
        spec = with_trace(load_rack(rack), str(trace) if trace else None)
        if window_s is not None:
            spec = spec.model_copy(update={"search": spec.search.model_copy(update={"window_s": window_s})})
        speed_key(interactivity, percentile)
        goals = [float(t) for t in csv_list(targets)] if targets else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    out.mkdir(parents=True, exist_ok=True)
    path = out / "frontier.json"
    previous = read_previous(path) if resume else []
    command = "rackserve sim frontier " + " ".join(shlex.quote(a) for a in sys.argv[3:])

    def write(report: dict) -> None:
        path.write_text(json.dumps(report, indent=1, default=float) + "\n")
        done = sum(p["source"] == "replay" for p in report["points"])
        console.print(f"{done} points replayed, {report['cpu_s']['total']:.0f} CPU s; wrote {path}")

    def runner():
        from rackserve.search.confirm import RayPool

        return RayPool(ray_address, num_cpus)

    try:
        report = search(spec, None if screen_only else runner, interactivity, percentile, goals, budget_cpu_s,
                        previous, write, {"command": command, "rack_file": str(rack)}, max_point_cpu_s)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    write(report)
    plot_frontier(report, out / "frontier.png")
    console.print(frontier_table(report))
    err = report["screen_error"]
    if err["median_throughput"] is not None:
        console.print(f"screen error (median |rel|): throughput/GPU {err['median_throughput']:.1%}, "
                      f"interactivity {err['median_tps_user']:.1%}")
    console.print(f"wrote {path} and {out / 'frontier.png'}")
