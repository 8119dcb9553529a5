"""Per-rank features of a batch for the plan's maps (window entries, sums of positions, indexer reads,
capped selections), the attention and indexer times they give, and one layer group's per-call results."""

from __future__ import annotations

import numpy as np

from rackserve.timing.plan import GroupPlan


def _linear(lo2: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """sum of p for p in (lo, hi], given lo2 = lo (lo + 1)."""
    return (hi * (hi + 1.0) - lo2) * 0.5


def _capped(lo: np.ndarray, lo2: np.ndarray, hi: np.ndarray, div: float, cap: float) -> np.ndarray:
    """sum of min(p / div, cap) for p in (lo, hi] (the knee clipped into [lo, hi])."""
    knee = np.minimum(np.maximum(lo, cap * div), hi)
    return _linear(lo2, knee) / div + (hi - knee) * cap


def _general_features(gp: GroupPlan, q: np.ndarray, end: np.ndarray, starts, nonempty, zeros=None):
    """Per-rank sums [W, L, Kr, capped per indexer code, W_read, L_read, capped_read per indexer
    code, tokens, seqs] for queries q ending at end; the read rows count each sequence's entries
    once (the union of its queries' windows, everything up to its last position, its last
    position's selection: batch_features.group_sums). _general_features_by_row's operations, element
    by element, on blocks of rows (GroupPlan's f_* constants). `zeros`: positions whose columns are
    set to zero before the sums (features_together's separators)."""
    n = q.size
    nidx = gp.f_ratio.shape[0]
    lo = end - q
    lo2 = lo * (lo + 1.0)
    rows = np.zeros((7 + 2 * nidx, n + 1))
    c = 2 + nidx  # L, W and the capped rows: _linear up to their knees, then _capped's terms
    knee = np.minimum(np.maximum(lo, gp.f_knee), end)
    lin = rows[:c, :n]
    np.multiply(knee * (knee + 1.0) - lo2, 0.5, out=lin)
    np.add(lin[1:] / gp.f_div, (end - knee[1:]) * gp.f_cap, out=lin[1:])
    np.multiply(end, np.ceil(q / 128.0), out=rows[c, :n])
    some = q > 0
    if gp.window:
        np.minimum(end, gp.window + q - 1.0, out=rows[c + 1, :n])
    rows[c + 2, :n] = end
    if nidx:
        np.minimum(end / gp.f_ratio, gp.f_top_k, out=rows[c + 3 : c + 3 + nidx, :n])
    reads = rows[c + 1 : c + 3 + nidx, :n]
    np.multiply(reads, some, out=reads)
    rows[-2, :n] = q
    rows[-1, :n] = some
    if zeros:
        rows[:, zeros] = 0.0
    return np.add.reduceat(rows, starts, axis=1)[gp.f_order] * nonempty  # [F_g + 2, R]


def _general_features_by_row(gp: GroupPlan, q: np.ndarray, end: np.ndarray, starts, nonempty):
    """_general_features row by row, as first written (the reference the tests compare it with)."""
    n = q.size
    nidx = len(gp.indexer_ratios)
    lo = end - q
    lo2 = lo * (lo + 1.0)
    rows = np.zeros((7 + 2 * nidx, n + 1))
    rows[0, :n] = _capped(lo, lo2, end, 1.0, gp.window)
    rows[1, :n] = _linear(lo2, end)
    rows[2, :n] = end * np.ceil(q / 128.0)
    some = q > 0
    r0 = 3 + nidx
    rows[r0, :n] = np.minimum(end, gp.window + q - 1.0) * some if gp.window else 0.0
    rows[r0 + 1, :n] = end * some
    for j, (ratio, top_k) in enumerate(gp.indexer_ratios):
        rows[3 + j, :n] = _capped(lo, lo2, end, ratio, top_k)
        rows[r0 + 2 + j, :n] = np.minimum(end / ratio, top_k) * some
    rows[-2, :n] = q
    rows[-1, :n] = q > 0
    return np.add.reduceat(rows, starts, axis=1) * nonempty  # [F_g + 2, R]


def _kv_times(gp: GroupPlan, feats: np.ndarray, fmap: np.ndarray, seqs: np.ndarray):
    """Per-rank (attention, indexer) times [R, 2], and per-rank compute/memory [R, 2C] each."""
    x = feats.T @ fmap  # [R, 4C]
    half = x.shape[1] // 2
    tc, tm = x[:, :half], x[:, half:]
    t = np.maximum(tc, tm) + gp.omo * np.minimum(tc, tm) + gp.overhead * (tm > 0)
    if gp.has_gather:
        t = t + (seqs > 0)[:, None] * gp.gather
    return t @ gp.weights, tc, tm


def _kv_times_many(gp: GroupPlan, fs: list[np.ndarray]) -> list[tuple]:
    """_kv_times(gp, f[:-2], gp.general_map, f[-1]) of each f of `fs` (the same ranks): the
    matrix products one by one, the element-wise operations on all of them stacked."""
    fmap = gp.general_map
    x = _stacked([f[:-2].T @ fmap for f in fs])  # [B, R, 4C]
    half = x.shape[2] // 2
    tc, tm = x[:, :, :half], x[:, :, half:]
    t = np.maximum(tc, tm) + gp.omo * np.minimum(tc, tm) + gp.overhead * (tm > 0)
    if gp.has_gather:
        seqs = _stacked([f[-1] for f in fs])
        t = t + (seqs > 0)[:, :, None] * gp.gather
    w = gp.weights
    return [(ti @ w, tci, tmi) for ti, tci, tmi in zip(t, tc, tm, strict=True)]


def _stacked(arrays: list[np.ndarray]) -> np.ndarray:
    """np.stack of arrays of one shape (cheaper: one concatenation, reshaped)."""
    return np.concatenate(arrays).reshape(len(arrays), *arrays[0].shape)


class Group:
    """One layer group's per-call results."""

    __slots__ = ("gp", "kv", "tc", "tm", "tokens", "seqs", "cm")

    def __init__(self, gp, kv, tc, tm, tokens, seqs, cm=None) -> None:
        self.gp, self.kv, self.tc, self.tm, self.tokens, self.seqs = gp, kv, tc, tm, tokens, seqs
        self.cm = cm  # per rank (attention, indexer) compute then memory times [R, 4], when known

    def cm_row(self, ra: int) -> np.ndarray:
        """Rank ra's (attention, indexer) compute, then memory times [4]."""
        if self.cm is not None:
            return self.cm[ra]
        w = self.gp.weights
        return np.concatenate((self.tc[ra] @ w, self.tm[ra] @ w))

    def cm_list(self, ra: int) -> list[float]:
        """cm_row(ra) as floats."""
        if self.cm is not None:
            return self.cm[ra].tolist()
        w = self.gp.weights
        return (self.tc[ra] @ w).tolist() + (self.tm[ra] @ w).tolist()
