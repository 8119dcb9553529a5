"""Throughput per GPU against per-user speed for a decode layout over a batch sweep.

Interactivity = 1000 / TPOT_ms (output tokens/s of one stream). A step with speculative decoding
emits accepted_tokens per sequence on average, so TPOT = step time / accepted tokens. Throughput per
GPU counts output tokens only (a pure decode instance): batch per rank x DP ranks / TPOT / GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rackserve.timing.batch import RankBatch, StepBatch
from rackserve.timing.layout import Layout


@dataclass(frozen=True)
class CurvePoint:
    batch_per_rank: int
    tpot_s: float
    tokens_per_s_per_user: float
    tokens_per_s_per_gpu: float
    dominant: str  # the largest breakdown component
    context: int = 0
    step_s: float = 0.0
    accepted_tokens: float = 1.0


def decode_batch(layout: Layout, batch_per_rank: int, context: int, tokens: int = 1) -> StepBatch:
    """`batch_per_rank` sequences at `context` tokens on every rank, each computing `tokens`."""
    rank = RankBatch(
        np.full(batch_per_rank, tokens, dtype=np.int64),
        np.full(batch_per_rank, context - 1, dtype=np.int64),
    )
    return StepBatch(tuple(rank for _ in range(layout.dp)))


def throughput_curve(tm, layout: Layout, context: int, batches: list[int]) -> list[CurvePoint]:
    points = []
    for b in batches:
        batch = decode_batch(layout, b, context, tm.verify_tokens)
        cost = tm.speculative_step_time(layout, batch)
        tpot = cost.total_s / cost.accepted_tokens
        dominant = max(cost.breakdown, key=cost.breakdown.get)
        per_gpu = b * layout.dp / tpot / layout.gpus
        points.append(
            CurvePoint(
                b, tpot, 1.0 / tpot, per_gpu, dominant, context, cost.total_s, cost.accepted_tokens
            )  # fmt: skip
        )
    return points


def parse_contexts(text: str) -> list[int]:
    """'8k,32k,128k,256k' -> [8192, 32768, 131072, 262144] (k = 1024; plain numbers as they are)."""
    out = []
    for item in (t.strip().lower() for t in text.split(",")):
        if not item:
            continue
        scale = 1024 if item.endswith("k") else 1
        digits = item[:-1] if scale > 1 else item
        if not digits.isdigit():
            raise ValueError(f"context: {item!r} is not a length like 32768 or 32k")
        value = int(digits) * scale
        if value < 1:
            raise ValueError(f"context: must be positive, got {item!r}")
        out.append(value)
    if not out:
        raise ValueError("context: give at least one length, e.g. 32k")
    return out
