"""Throughput per GPU against per-user speed for a decode layout over a batch sweep.

Interactivity = 1000 / TPOT_ms (output tokens/s of one stream). Throughput per GPU counts output
tokens only (a pure decode instance): batch per rank x DP ranks / TPOT / GPUs.
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


def decode_batch(layout: Layout, batch_per_rank: int, context: int) -> StepBatch:
    rank = RankBatch(
        np.ones(batch_per_rank, dtype=np.int64),
        np.full(batch_per_rank, context - 1, dtype=np.int64),
    )
    return StepBatch(tuple(rank for _ in range(layout.dp)))


def throughput_curve(tm, layout: Layout, context: int, batches: list[int]) -> list[CurvePoint]:
    points = []
    for b in batches:
        cost = tm.step_time("decode", layout, decode_batch(layout, b, context))
        tpot = cost.total_s
        dominant = max(cost.breakdown, key=cost.breakdown.get)
        points.append(CurvePoint(b, tpot, 1.0 / tpot, b * layout.dp / tpot / layout.gpus, dominant))
    return points
