"""Reduce a step's batch to the per-rank sums the cost formulas need (tokens, attended KV entries,
indexer scan length), in closed form over each sequence's positions, vectorized over sequences.

A rank computes positions (start, end] of each sequence in a layer group; a query at position p
attends min(p, window) window entries plus, per attention code, min(p / ratio, top_k) selected
(indexer codes) or p / ratio (dense codes) compressed entries, and its indexer scans p / ratio keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rackserve.timing.batch import RankBatch
from rackserve.timing.spec import ModelSpec


@dataclass(frozen=True)
class CodeShape:
    """One attention code of the model: compression ratio, whether the indexer selects top_k."""

    ratio: int
    indexer: bool
    top_k: int


@dataclass(frozen=True)
class GroupSums:
    """Sums over one rank's sequences for one layer group (arrays indexed by attention code)."""

    tokens: float
    seqs: float
    window_entries: float  # sum over queries of min(p, window)
    comp_entries: np.ndarray  # per code: sum over queries of selected/dense compressed entries
    scan_entries: np.ndarray  # per code: sum over queries of p / ratio (indexer codes only)
    key_reads: np.ndarray  # per code: indexer keys read (per sequence, once per 128-query tile)


def _sum_linear(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """sum of p for p in (lo, hi]."""
    return (hi * (hi + 1.0) - lo * (lo + 1.0)) * 0.5


def _sum_capped(lo: np.ndarray, hi: np.ndarray, div: float, cap: float) -> np.ndarray:
    """sum of min(p / div, cap) for p in (lo, hi]."""
    knee = np.clip(cap * div, lo, hi)
    return _sum_linear(lo, knee) / div + (hi - knee) * cap


def code_shapes(model: ModelSpec) -> tuple[CodeShape, ...]:
    top_k = model.indexer.top_k if model.indexer else 0
    codes = sorted(model.attention.codes)
    return tuple(
        CodeShape(model.attention.codes[c].ratio, model.attention.codes[c].indexer, top_k)
        for c in codes
    )


def group_sums(
    queries: np.ndarray, end: np.ndarray, window: int, codes: tuple[CodeShape, ...]
) -> GroupSums:
    """Sums for sequences computing `queries` positions ending at `end` (arrays per sequence)."""
    lo = (end - queries).astype(np.float64)
    hi = end.astype(np.float64)
    comp = np.zeros(len(codes))
    scan = np.zeros(len(codes))
    keys = np.zeros(len(codes))
    for i, code in enumerate(codes):
        if code.ratio == 0:
            continue
        if code.indexer:
            comp[i] = _sum_capped(lo, hi, code.ratio, code.top_k).sum()
            scan[i] = _sum_linear(lo, hi).sum() / code.ratio
            keys[i] = (hi / code.ratio * np.ceil(queries / 128.0)).sum()
        else:
            comp[i] = _sum_linear(lo, hi).sum() / code.ratio
    win = _sum_capped(lo, hi, 1.0, float(window)).sum() if window else 0.0
    return GroupSums(
        float(queries.sum()), float(np.count_nonzero(queries)), float(win), comp, scan, keys
    )


def rank_groups(
    rb: RankBatch, phase: str, model: ModelSpec, codes: tuple[CodeShape, ...]
) -> tuple[GroupSums, GroupSums | None]:
    """(all-layer group, tail group). Decode: every layer computes every new token. Prefill (causal
    encoder-decoder): layers < full_layers compute every new token, the rest only the last
    tail_tokens positions of each sequence (assumes each sequence's chunk ends its prompt)."""
    new = rb.new_tokens
    end = rb.cached_tokens + new
    full = group_sums(new, end, model.attention.window, codes)
    if phase == "decode" or model.prefill.full_layers >= model.layers:
        return full, None
    tail = np.minimum(new, model.prefill.tail_tokens)
    return full, group_sums(tail, end, model.attention.window, codes)
