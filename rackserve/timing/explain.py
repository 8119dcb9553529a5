"""What each switch buys: the step priced with every enabled switch, then with one switch off at a
time (the others kept), for `rackserve timing --explain`."""

from __future__ import annotations

from dataclasses import dataclass

from rackserve.timing.batch import RankBatch, StepBatch, StepCost
from rackserve.timing.layout import Layout


@dataclass(frozen=True)
class SwitchSaving:
    switch: str
    step_saving_s: float  # step time without the switch - with it
    per_token_saving_s: float  # the same per output token (TPOT) for decode, = step for prefill


def step_batch(tm, phase: str, lay: Layout, tokens: int, cached: int, batch: int, context: int):
    """The CLI's step: one prompt chunk per DP rank, or `batch` sequences at `context` tokens per
    rank, each computing tm.verify_tokens positions (1 without MTP)."""
    if phase == "prefill":
        rank = RankBatch.of([tokens], [cached])
    elif phase == "decode":
        rank = RankBatch.of([tm.verify_tokens] * batch, [max(context - 1, 0)] * batch)
    else:
        raise ValueError(f"phase: must be prefill or decode, got {phase!r}")
    return StepBatch(tuple(rank for _ in range(lay.dp)))


def price(tm, phase: str, lay: Layout, batch: StepBatch) -> StepCost:
    """A decode step as the deployment runs it (speculative where MTP is on), or a prefill step."""
    if phase == "decode":
        return tm.speculative_step_time(lay, batch)
    return tm.step_time(phase, lay, batch)


def per_token_s(cost: StepCost, phase: str) -> float:
    return cost.total_s / cost.accepted_tokens if phase == "decode" else cost.total_s


def switch_savings(
    tm, phase: str, lay: Layout, shape: tuple[int, int, int, int]
) -> list[SwitchSaving]:
    """Each enabled switch's saving, one off at a time, largest per-token saving first."""
    full = price(tm, phase, lay, step_batch(tm, phase, lay, *shape))
    out = []
    for name in tm.optimizations.enabled():
        off = tm.with_optimizations(tm.optimizations.with_switch(name, False))
        cost = price(off, phase, lay, step_batch(off, phase, lay, *shape))
        out.append(SwitchSaving(name, cost.total_s - full.total_s,
                                per_token_s(cost, phase) - per_token_s(full, phase)))  # fmt: skip
    return sorted(out, key=lambda s: -s.per_token_saving_s)
