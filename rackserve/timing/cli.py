"""`rackserve timing ...`: one step's cost breakdown (with --explain, what each switch saves), and
`rackserve timing curve ...`: a decode layout's throughput per GPU against per-user speed."""

from __future__ import annotations

import json
from dataclasses import asdict

import typer

from rackserve.timing.curve import parse_contexts, throughput_curve
from rackserve.timing.explain import per_token_s, price, step_batch, switch_savings
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


ACCEPT = typer.Option(None, "--acceptance-length",
                      help="accepted tokens per MTP step (default: the model's pinned value, 2.49 for V4.1-Flash)")


def _model(hardware: str, model: str, opt: str, acceptance_length: float | None = None) -> TimingModel:
    try:
        return TimingModel.create(hardware, model, opt, acceptance_length=acceptance_length)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _layout(tm: TimingModel, layout: str, ranks: int | None):
    try:
        return tm.layout(layout, ranks)
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
    acceptance_length: float = ACCEPT,
    explain: bool = typer.Option(
        False, "--explain", help="each switch's saving, one off at a time"
    ),
    as_json: bool = JSON,
) -> None:
    """Print the simulated duration of one step and its breakdown by component."""
    if ctx.invoked_subcommand:
        return
    tm = _model(hardware, model, opt, acceptance_length)
    lay = _layout(tm, layout, ranks)
    shape = (tokens, cached, batch, context)
    try:
        cost = price(tm, phase, lay, step_batch(tm, phase, lay, *shape))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    savings = switch_savings(tm, phase, lay, shape) if explain else []
    summary = _summary(tm, phase, cost)
    if as_json:
        out = {"hardware": hardware, "model": model, "layout": lay.key, "phase": phase,
               "optimizations": tm.optimizations.enabled(), "skipped_switches": tm.skipped_switches,
               "total_s": cost.total_s, "breakdown": cost.breakdown, "bound": cost.bound,
               "hidden_s": cost.hidden_s, "rank_busy_s": list(cost.rank_busy_s), **summary}  # fmt: skip
        if explain:
            out["switch_savings"] = [asdict(s) for s in savings]
        typer.echo(json.dumps(out))
        return
    typer.echo(f"{hardware} {model} {lay.key} {phase}  opt={opt}")
    typer.echo(f"{'component':18} {'ms':>10} {'share':>7}  bound")
    for name, sec in sorted(cost.breakdown.items(), key=lambda kv: -kv[1]):
        share = sec / cost.total_s * 100 if cost.total_s else 0.0
        typer.echo(f"{name:18} {sec * 1e3:10.4f} {share:6.1f}%  {cost.bound.get(name, '')}")
    typer.echo(f"{'total':18} {cost.total_s * 1e3:10.4f}")
    for name, sec in cost.hidden_s.items():
        typer.echo(f"hidden {name}: {sec * 1e3:.4f} ms overlapped with compute (not in total)")
    if phase == "decode":
        _echo_decode(tm, cost, summary)
    for name, why in tm.skipped_switches.items():
        typer.echo(f"skipped switch {name}: {why}")
    if explain:
        typer.echo(f"{'switch off':18} {'step +us':>10} {'per token +us':>14}")
        for s in savings:
            typer.echo(
                f"{s.switch:18} {s.step_saving_s * 1e6:10.1f} {s.per_token_saving_s * 1e6:14.1f}"
            )


def _summary(tm: TimingModel, phase: str, cost) -> dict:
    if phase != "decode":
        return {}
    draft = cost.breakdown.get("mtp_draft", 0.0)
    tpot = per_token_s(cost, phase)
    spec = tm.speculation
    return {"verify_s": cost.total_s - draft, "draft_s": draft,
            "accepted_tokens": cost.accepted_tokens, "verify_tokens": tm.verify_tokens,
            "draft_passes": spec.draft_tokens if spec else 0,
            "acceptance_rates": list(spec.acceptance) if spec else [],
            "tpot_s": tpot, "tokens_per_s_per_user": 1.0 / tpot if tpot else 0.0}  # fmt: skip


def _echo_decode(tm: TimingModel, cost, s: dict) -> None:
    if tm.speculation is not None:
        rates = ", ".join(f"{a:.3f}" for a in s["acceptance_rates"])
        typer.echo(f"MTP acceptance: {s['accepted_tokens']:.3f} tokens/step "
                   f"(P(draft kept | earlier kept) per position: {rates})")
        typer.echo(
            f"MTP: verify {s['verify_tokens']} positions {s['verify_s'] * 1e3:.4f} ms + draft "
            f"{s['draft_s'] * 1e3:.4f} ms ({s['draft_passes']} passes one after another); "
            f"expected accepted {s['accepted_tokens']:.3f} tokens/step"
        )
    typer.echo(f"TPOT {s['tpot_s'] * 1e3:.4f} ms  ->  {s['tokens_per_s_per_user']:.1f} tok/s/user")


@app.command()
def curve(
    hardware: str = HW,
    model: str = MODEL,
    layout: str = typer.Option("wide-ep", "--layout", help="decode layout: wide-ep | tp8"),
    ranks: int = RANKS,
    context: str = typer.Option("32768", "--context", help="one or more lengths: 8k,32k,128k"),
    batches: str = typer.Option(
        "1,2,4,8,16,32,64,128,256", "--batches", help="sequences per DP rank"
    ),
    opt: str = OPT,
    as_json: bool = JSON,
) -> None:
    """Throughput per GPU vs per-user tokens/s (interactivity = 1000 / TPOT_ms) over a batch sweep,
    for each context length."""
    tm = _model(hardware, model, opt)
    lay = _layout(tm, layout, ranks)
    try:
        contexts = parse_contexts(context)
        sweep = [int(b) for b in batches.split(",") if b.strip()]
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    points = [p for c in contexts for p in throughput_curve(tm, lay, c, sweep)]
    if as_json:
        typer.echo(json.dumps({"hardware": hardware, "model": model, "layout": lay.key,
                               "contexts": contexts, "points": [asdict(p) for p in points]}))  # fmt: skip
        return
    typer.echo(f"{hardware} {model} {lay.key} decode, opt={opt}, tokens/step {tm.verify_tokens}")
    typer.echo(f"{'context':>8} {'batch/rank':>10} {'step ms':>8} {'TPOT ms':>8} {'tok/s/user':>11} "
               f"{'tok/s/GPU':>10}  dominant")  # fmt: skip
    for p in points:
        typer.echo(
            f"{p.context:8d} {p.batch_per_rank:10d} {p.step_s * 1e3:8.3f} {p.tpot_s * 1e3:8.3f} "
            f"{p.tokens_per_s_per_user:11.1f} {p.tokens_per_s_per_gpu:10.1f}  {p.dominant}"
        )
