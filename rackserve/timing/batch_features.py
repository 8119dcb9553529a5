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
    # KV entries read from HBM, each sequence's once (its queries share them): the union of its
    # queries' windows, min(end, window + q - 1); per code, its compressed entries up to its last
    # position (dense) or its last position's selection (indexer codes: the block's adjacent
    # queries select about the same top-k). Decode prices attention bytes from these.
    window_reads: float = 0.0
    comp_reads: np.ndarray | None = None


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
    reads = np.zeros(len(codes))
    some = queries > 0
    for i, code in enumerate(codes):
        if code.ratio == 0:
            continue
        if code.indexer:
            comp[i] = _sum_capped(lo, hi, code.ratio, code.top_k).sum()
            scan[i] = _sum_linear(lo, hi).sum() / code.ratio
            keys[i] = (hi / code.ratio * np.ceil(queries / 128.0)).sum()
            reads[i] = (np.minimum(hi / code.ratio, code.top_k) * some).sum()
        else:
            comp[i] = _sum_linear(lo, hi).sum() / code.ratio
            reads[i] = (hi * some).sum() / code.ratio
    win = _sum_capped(lo, hi, 1.0, float(window)).sum() if window else 0.0
    win_reads = (np.minimum(hi, window + queries - 1.0) * some).sum() if window else 0.0
    return GroupSums(
        float(queries.sum()), float(np.count_nonzero(queries)), float(win), comp, scan, keys,
        float(win_reads), reads,
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


@dataclass(frozen=True)
class GroupArrays:
    """One layer group's sums for every rank of a step (arrays over ranks; [ranks, codes] per code)."""

    tokens: np.ndarray
    seqs: np.ndarray
    window_entries: np.ndarray
    comp_entries: np.ndarray
    scan_entries: np.ndarray
    key_reads: np.ndarray
    window_reads: np.ndarray  # GroupSums.window_reads per rank
    comp_reads: np.ndarray  # [ranks, codes]

    @staticmethod
    def stack(sums: list[GroupSums]) -> GroupArrays:
        return GroupArrays(
            np.array([s.tokens for s in sums]),
            np.array([s.seqs for s in sums]),
            np.array([s.window_entries for s in sums]),
            np.array([s.comp_entries for s in sums]),
            np.array([s.scan_entries for s in sums]),
            np.array([s.key_reads for s in sums]),
            np.array([s.window_reads for s in sums]),
            np.array([s.comp_reads for s in sums]),
        )


def step_arrays(
    ranks, phase: str, model: ModelSpec, codes: tuple[CodeShape, ...]
) -> tuple[GroupArrays, GroupArrays | None]:
    """Per-rank sums of a whole step: the vectorized single-token decode form when it applies (one
    pass over all ranks' sequences), else rank by rank."""
    if phase == "decode":
        fast = _decode_arrays(ranks, model.attention.window, codes)
        if fast is not None:
            return fast, None
    per_rank = [rank_groups(rb, phase, model, codes) for rb in ranks]
    full = GroupArrays.stack([g[0] for g in per_rank])
    if per_rank[0][1] is None:
        return full, None
    return full, GroupArrays.stack([g[1] for g in per_rank])


def _decode_arrays(ranks, window: int, codes: tuple[CodeShape, ...]) -> GroupArrays | None:
    """Every sequence computes one token at position e = cached + 1: the sums reduce to sums of
    e, min(e, window) and min(e, top_k x ratio) per rank (exactly the general formulas at q = 1).
    One pass over all ranks' sequences: capped copies of e, summed per rank segment (a trailing
    zero column keeps every segment start valid; empty segments, idle ranks, are masked to 0)."""
    new = np.concatenate([rb.new_tokens for rb in ranks])
    if new.size == 0 or new.min() != 1 or new.max() != 1:
        return None
    end = np.concatenate([rb.cached_tokens for rb in ranks]) + 1.0
    caps = _decode_caps(window, codes)
    n = end.size
    capped = np.zeros((len(caps), n + 1))
    np.minimum(end, caps[:, None], out=capped[:, :n])
    counts = np.array([rb.new_tokens.shape[0] for rb in ranks])
    starts = np.cumsum(counts) - counts
    sums = np.add.reduceat(capped, starts, axis=1) * (counts > 0)  # [features, ranks]
    seqs = counts.astype(np.float64)
    comp = np.zeros((len(ranks), len(codes)))
    scan = np.zeros_like(comp)
    for i, code in enumerate(codes):
        if code.ratio == 0:
            continue
        if code.indexer:
            comp[:, i] = sums[2 + i] / code.ratio
            scan[:, i] = sums[0] / code.ratio
        else:
            comp[:, i] = sums[0] / code.ratio
    return GroupArrays(seqs, seqs, sums[1], comp, scan, scan, sums[1], comp)  # one query: reads = entries


def _decode_caps(window: int, codes: tuple[CodeShape, ...]) -> np.ndarray:
    """Caps of e: none, the window, then per code top_k x ratio (indexer codes; unused otherwise)."""
    per_code = [c.top_k * c.ratio if c.indexer else np.inf for c in codes]
    return np.array([np.inf, float(window) if window else 0.0, *per_code])
