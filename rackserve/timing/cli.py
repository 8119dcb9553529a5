"""`rackserve timing ...`: one step's cost breakdown, and `rackserve timing curve ...`: a decode
layout's throughput per GPU against per-user speed over a batch sweep."""

from __future__ import annotations

import json
from dataclasses import asdict

import typer

from rackserve.timing.batch import RankBatch, StepBatch
from rackserve.timing.curve import throughput_curve
from rackserve.timing.timing_model import TimingModel

app = typer.Typer(invoke_without_command=True, add_completion=False, help=__doc__)

HW = typer.Option("vr200", "--hardware", help="vr200 | gb300 | gb200 | h200")
MODEL = typer.Option("deepseek-v4.1-flash", "--model", help="deepseek-v4.1-flash | deepseek-v3")
OPT = typer.Option(
    "rubin-optimized",
    "--opt",
    help="preset (baseline, rubin-optimized) and/or switches, comma-separated",
)
RANKS = typer.Option(None, "--ranks", help="wide-ep ranks (default 8)")
JSON = typer.Option(False, "--json", help="print one JSON object")


def _model(hardware: str, model: str, opt: str) -> TimingModel:
    try:
        return TimingModel.create(hardware, model, opt)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


@app.callback()
def step(
    ctx: typer.Context,
    hardware: str = HW,
    model: str = MODEL,
    layout: str = typer.Option("dep2", "--layout", help="dep2 | wide-ep | tp8"),
    ranks: int = RANKS,
    phase: str = typer.Option("prefill", "--phase", help="prefill | decode"),
    tokens: int = typer.Option(8192, "--tokens", help="prefill: new tokens per DP rank"),
    cached: int = typer.Option(0, "--cached", help="prefill: cached prefix tokens of that prompt"),
    batch: int = typer.Option(64, "--batch", help="decode: sequences per DP rank"),
    context: int = typer.Option(32768, "--context", help="decode: context length of each sequence"),
    opt: str = OPT,
    as_json: bool = JSON,
) -> None:
    """Print the simulated duration of one step and its breakdown by component."""
    if ctx.invoked_subcommand:
        return
    tm = _model(hardware, model, opt)
    try:
        lay = tm.layout(layout, ranks)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if phase == "prefill":
        rank = RankBatch.of([tokens], [cached])
    elif phase == "decode":
        rank = RankBatch.of([1] * batch, [max(context - 1, 0)] * batch)
    else:
        raise typer.BadParameter(f"phase: must be prefill or decode, got {phase!r}")
    cost = tm.step_time(phase, lay, StepBatch(tuple(rank for _ in range(lay.dp))))
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "hardware": hardware,
                    "model": model,
                    "layout": lay.key,
                    "phase": phase,
                    "optimizations": tm.optimizations.enabled(),
                    "total_s": cost.total_s,
                    "breakdown": cost.breakdown,
                    "bound": cost.bound,
                    "rank_busy_s": list(cost.rank_busy_s),
                }
            )
        )
        return
    typer.echo(f"{hardware} {model} {lay.key} {phase}  opt={opt}")
    typer.echo(f"{'component':18} {'ms':>10} {'share':>7}  bound")
    for name, sec in sorted(cost.breakdown.items(), key=lambda kv: -kv[1]):
        share = sec / cost.total_s * 100 if cost.total_s else 0.0
        typer.echo(f"{name:18} {sec * 1e3:10.4f} {share:6.1f}%  {cost.bound.get(name, '')}")
    typer.echo(f"{'total':18} {cost.total_s * 1e3:10.4f}")


@app.command()
def curve(
    hardware: str = HW,
    model: str = MODEL,
    layout: str = typer.Option("wide-ep", "--layout", help="decode layout: wide-ep | tp8"),
    ranks: int = RANKS,
    context: int = typer.Option(32768, "--context"),
    batches: str = typer.Option(
        "1,2,4,8,16,32,64,128,256", "--batches", help="sequences per DP rank"
    ),
    opt: str = OPT,
    as_json: bool = JSON,
) -> None:
    """Throughput per GPU vs per-user tokens/s (interactivity = 1000 / TPOT_ms) over a batch sweep."""
    tm = _model(hardware, model, opt)
    try:
        lay = tm.layout(layout, ranks)
        sweep = [int(b) for b in batches.split(",") if b.strip()]
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    points = throughput_curve(tm, lay, context, sweep)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "hardware": hardware,
                    "model": model,
                    "layout": lay.key,
                    "context": context,
                    "points": [asdict(p) for p in points],
                }
            )
        )
        return
    typer.echo(f"{hardware} {model} {lay.key} decode, context {context}, opt={opt}")
    typer.echo(f"{'batch/rank':>10} {'TPOT ms':>9} {'tok/s/user':>11} {'tok/s/GPU':>10}  dominant")
    for p in points:
        typer.echo(
            f"{p.batch_per_rank:10d} {p.tpot_s * 1e3:9.3f} {p.tokens_per_s_per_user:11.1f} {p.tokens_per_s_per_gpu:10.1f}  {p.dominant}"
        )
