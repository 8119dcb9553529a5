"""`rackserve sim frontier RACK.yaml ...`: search a rack's deployments, write frontier.json + plot."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from rackserve.search.frontier import merge_replays, read_previous, search, speed_key, with_trace
from rackserve.search.plot import frontier_table, plot_frontier
from rackserve.search.rack import load_rack
from rackserve.sim.cli_args import (
    NoStepStoreOption,
    StepStoreOption,
    console,
    csv_list,
    use_step_store,
)

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
    resume_from: Annotated[list[Path] | None, typer.Option(
        help="also keep the replayed points of this frontier.json of the same rack (repeatable)")] = None,
    step_store: StepStoreOption = None,
    no_step_store: NoStepStoreOption = False,
) -> None:
    """Screen every configuration, confirm the envelope by replay, report it as AgentX reads it."""
    use_step_store(step_store, out, not no_step_store)
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
    try:
        missing = [str(f) for f in resume_from or [] if not Path(f).exists()]
        if missing:
            raise ValueError(f"--resume-from: no such file {', '.join(missing)}")
        previous = merge_replays(read_previous(path, spec.name) if resume else [],
                                 *(read_previous(Path(f), spec.name) for f in resume_from or []))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
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


docs_app = typer.Typer(add_completion=False)


@docs_app.command()
def frontier_docs(
    reports: Annotated[list[Path], typer.Argument(help="frontier.json files; the first is the ratio's numerator")],
    readme: Annotated[Path, typer.Option(help="README whose frontier block to fill")] = Path("README.md"),
    page: Annotated[Path, typer.Option(help="the results page to write")] = Path("docs/results.md"),
) -> None:
    """Write docs/results.md and the README's results block from frontier.json files."""
    from rackserve.search.pages import headline, replace_block, results_page

    try:
        data = [json.loads(p.read_text()) for p in reports]
        text = replace_block(readme.read_text(), headline(data))
    except (OSError, ValueError, KeyError) as exc:
        raise typer.BadParameter(str(exc)) from None
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(results_page(data, [str(p) for p in reports], str(page.parent)) + "\n")
    readme.write_text(text)
    console.print(f"wrote {page} and the results block of {readme}")


explain_app = typer.Typer(add_completion=False)


@explain_app.command()
def frontier_explain(
    a: Annotated[Path, typer.Argument(help="rack A (the base)")],
    b: Annotated[Path, typer.Argument(help="rack B")],
    targets: Annotated[str, typer.Option(help="comma-separated tok/s/user targets (default: A's)")] = "",
    percentile: Annotated[str, typer.Option(help="p90 or p50")] = "p90",
    interactivity: Annotated[str, typer.Option(help="e2e or itl")] = "e2e",
    out: Annotated[Path, typer.Option(help="folder for explain.json")] = Path("out/frontier-explain"),
) -> None:
    """Walk from rack A to rack B one field at a time (hardware, optimizations, ...), screening the
    whole search space at every step: envelope against envelope at each target, with the winner."""
    from rackserve.search.explain import walk_racks

    try:
        goals = [float(t) for t in csv_list(targets)] if targets else None
        steps = walk_racks(load_rack(a), load_rack(b), interactivity, percentile, goals)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    out.mkdir(parents=True, exist_ok=True)
    (out / "explain.json").write_text(json.dumps({"schema": "rackserve.sim.frontier-explain/1", "a": str(a),
                                                  "b": str(b), "steps": steps}, indent=1, default=float) + "\n")
    from rich.table import Table

    table = Table(title=f"{a.name} -> {b.name}: screened envelope at each step ({percentile} {interactivity})")
    table.add_column("step")
    table.add_column("change")
    for t in steps[0]["at_target"]:
        table.add_column(f"at {t}")
        table.add_column(f"winner at {t}")
    table.add_column("peak")
    for s in steps:
        cells = []
        for w in s["at_target"].values():
            cells += ["not reached", "-"] if w is None else [f"{w['throughput_per_gpu']:,.0f}", w["config"]["label"]]
        table.add_row(str(s["step"]), s["change"], *cells, f"{s['peak']:,.0f}")
    console.print(table)
    console.print(f"wrote {out / 'explain.json'}")


sensitivity_app = typer.Typer(add_completion=False)


@sensitivity_app.command()
def sensitivity(
    rack: Annotated[Path, typer.Argument(help="rack file (scenarios/racks/*.yaml)")],
    versus: Annotated[Path | None, typer.Option(help="a second rack: the rack-over-rack ratio's moves too")] = None,
    out: Annotated[Path, typer.Option(help="folder for sensitivity.json and sensitivity.md")] = Path("out/sensitivity"),
    confirm: Annotated[int, typer.Option(help="replay the top K parameters of each rack at its frontier's point")] = 0,
    frontier: Annotated[list[Path] | None, typer.Option(help="frontier.json of a rack (repeat per rack; --confirm)")] = None,
    target: Annotated[str | None, typer.Option(help="--confirm at this target of the frontier (default: its first)")] = None,
) -> None:
    """Every FREE parameter of the rack's hardware and model files at -25% / +25%: how far the screened
    envelope's throughput at each target and the peak move, ranked; with --confirm K, the top K of each
    rack replayed at the point its frontier chose."""
    from rackserve.search import sensitivity as sens
    from rackserve.search import sensitivity_confirm as conf

    try:
        racks = [load_rack(rack)] + ([load_rack(versus)] if versus else [])
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="RACK") from None
    if confirm < 0:
        raise typer.BadParameter("must be >= 0", param_hint="--confirm")
    frontiers = {}
    if confirm:
        if not frontier:
            raise typer.BadParameter("--confirm needs the racks' frontier.json (--frontier F)", param_hint="--frontier")
        try:
            frontiers = conf.read_frontiers(frontier)
            for doc_f in frontiers.values():
                conf.chosen_point(doc_f, target)
        except (OSError, ValueError, KeyError) as exc:
            raise typer.BadParameter(str(exc), param_hint="--frontier") from None
    doc = sens.sensitivity(*racks)
    if confirm:
        doc["confirmed"] = conf.confirm(doc, racks, frontiers, confirm, target)
    sens.write(doc, out, conf.markdown(doc["confirmed"]) if confirm else "")
    for row in doc["rows"][:10]:
        print(f"{row['rack']:>14}  {row['param']:<48} {row['max_abs_move']:+.1%}")
    print(f"wrote {out / 'sensitivity.json'} and {out / 'sensitivity.md'}")
