"""What the `rackserve sim` commands share: the console, comma lists, and loading a scenario with
its command-line overrides (a bad scenario or trace is a typer.BadParameter naming it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rackserve.sim.run import with_concurrency, with_trace
from rackserve.sim.scenario import Scenario, load_scenario
from rackserve.sim.step_store import ENV as STEP_STORE_ENV

console = Console()

# --step-store / --no-step-store of every `rackserve sim` command that runs the simulator (use_step_store)
StepStoreOption = Annotated[Path | None, typer.Option(
    help="keep priced steps here for later runs (default: $RACKSERVE_STEP_STORE, else OUT/step-store)")]
NoStepStoreOption = Annotated[bool, typer.Option("--no-step-store", help="keep no priced steps, read none")]


def csv_list(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def load_with_overrides(
    scenario: Path, trace: Path | None, concurrency: int | None, duration: float | None
) -> Scenario:
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


def use_step_store(directory: Path | None, out: Path, enabled: bool = True) -> None:
    """Where priced steps are kept for later runs (rackserve/sim/step_store.py): --step-store DIR, else
    $RACKSERVE_STEP_STORE, else OUT/step-store; none with --no-step-store. Passed on through the
    environment, so that a search's Ray workers use it too."""
    if not enabled:
        os.environ.pop(STEP_STORE_ENV, None)
        return
    if directory is None:
        if os.environ.get(STEP_STORE_ENV, "").strip():
            return
        directory = out / "step-store"
    if directory.exists() and not directory.is_dir():
        raise typer.BadParameter(f"--step-store: {directory} is not a directory")
    os.environ[STEP_STORE_ENV] = str(directory)
