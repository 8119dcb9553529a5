"""Two-micro-batch overlap (vLLM's dual batch overlap): the step's sequences are split in two halves
and, layer by layer, one half's EP dispatch/combine runs while the other half computes.

With C_a, C_b the two halves' compute (everything but dispatch/combine) and M_a, M_b their
dispatch/combine over L MoE layers, the step takes
    max(C_a + C_b + M_b / L,  M_a + M_b + C_a / L)
(the first half's first layer and the second half's last combine cannot hide). Two half batches
stream the weights twice, so a tuned stack overlaps only where it pays: the step is the faster of
this and the serial step, never faster than its longest part (all compute or all communication).
"""

from __future__ import annotations

import numpy as np

from rackserve.timing.batch import RankBatch, StepBatch, StepCost
from rackserve.timing.parts import HOST

OVERLAPPED = "dispatch_combine"


def split_in_two(batch: StepBatch) -> tuple[StepBatch, StepBatch] | None:
    """Each rank's tokens cut at their midpoint, as vLLM's micro-batch split does (a sequence that
    straddles it is computed in two parts, the second after the first); None when nothing splits.
    The last batch's halves are kept: an MTP step splits one verify batch for the verify pass and
    again for the draft pass (the entry holds the batch, so its identity is never reused)."""
    global _LAST
    last = _LAST  # one read: another thread may replace it
    if last[0] is batch:
        return last[1]
    halves = _split(batch)
    _LAST = (batch, halves)
    return halves


def _split(batch: StepBatch) -> tuple[StepBatch, StepBatch] | None:
    ranks = batch.ranks
    if not ranks:
        return None
    # ranks that share one batch share its halves: each distinct batch split once
    made = {k: _split_rank(rb) for k, rb in {id(rb): rb for rb in ranks}.items()}
    a, b = zip(*map(made.__getitem__, map(id, ranks)), strict=True)
    if not any(h[1].new_tokens.shape[0] for h in made.values()):
        return None
    experts = None if batch.expert_tokens is None else np.asarray(batch.expert_tokens) / 2.0
    return StepBatch(a, experts), StepBatch(b, experts)


_EMPTY = np.zeros(0, dtype=np.int64)
_LAST: tuple = (None, None)  # (batch, its halves)


def _split_rank(rb: RankBatch) -> tuple[RankBatch, RankBatch]:
    new, cached = rb.new_tokens, rb.cached_tokens
    n = new.shape[0]
    total = int(new.sum())
    if total < 2:
        return rb, RankBatch(_EMPTY, _EMPTY)
    if total == n:  # single-token decode: half the sequences each (the simulator's hot path)
        h = (n + 1) // 2
        first = RankBatch(new[:h], cached[:h], rb.pool_hbm_tokens, rb.pool_dram_tokens)
        return first, RankBatch(new[h:], cached[h:])
    ends = np.cumsum(new)
    mid = total // 2
    i = int(np.searchsorted(ends, mid))  # the sequence holding the midpoint
    head = int(mid - (ends[i] - new[i]))  # its tokens that go to the first half
    rest = int(new[i] - head)
    # slices of the int64 arrays (copied where an entry changes): the same halves as appending
    # the straddling sequence's parts, without a new array per part
    if head:
        a_new, a_cached = new[: i + 1].copy(), cached[: i + 1]
        a_new[i] = head
    else:
        a_new, a_cached = new[:i], cached[:i]
    if rest:
        b_new, b_cached = new[i:].copy(), cached[i:].copy()
        b_new[0], b_cached[0] = rest, cached[i] + head
    else:
        b_new, b_cached = new[i + 1 :], cached[i + 1 :]
    first = RankBatch(_int64(a_new), _int64(a_cached), rb.pool_hbm_tokens, rb.pool_dram_tokens)
    return first, RankBatch(_int64(b_new), _int64(b_cached))


def _int64(a: np.ndarray) -> np.ndarray:
    return a if a.dtype == np.int64 else a.astype(np.int64)


def overlap_total(t_a: float, m_a: float, t_b: float, m_b: float, moe_layers: int, serial_s: float) -> float | None:
    """The overlapped step's time from its halves' totals t and dispatch/combine times m (module
    docstring), or None where it is not faster than the serial step's `serial_s`."""
    c_a, c_b = t_a - m_a, t_b - m_b
    layers = max(moe_layers, 1)
    total = max(c_a + c_b + m_b / layers, m_a + m_b + c_a / layers)
    if total >= serial_s or m_a + m_b <= 0:
        return None
    return total


def overlapped(serial: StepCost, a: StepCost, b: StepCost, moe_layers: int) -> StepCost:
    """The step with its two halves overlapped, or `serial` where overlap would not be faster."""
    m_a, m_b = a.breakdown.get(OVERLAPPED, 0.0), b.breakdown.get(OVERLAPPED, 0.0)
    host_b = b.breakdown.get(HOST, 0.0)  # the step's host work is paid once, not per micro-batch
    t_b = b.total_s - host_b
    total = overlap_total(a.total_s, m_a, t_b, m_b, moe_layers, serial.total_s)
    if total is None:
        return serial
    c_a, c_b = a.total_s - m_a, t_b - m_b
    names = {**serial.breakdown, **a.breakdown, **b.breakdown}
    breakdown = {k: a.breakdown.get(k, 0.0) + b.breakdown.get(k, 0.0) for k in names}
    if HOST in breakdown:
        breakdown[HOST] = a.breakdown.get(HOST, 0.0)
    exposed = total - (c_a + c_b)
    breakdown[OVERLAPPED] = exposed
    busy = tuple(min(x + y, total) for x, y in zip(a.rank_busy_s, b.rank_busy_s, strict=True))
    hidden = {OVERLAPPED: m_a + m_b - exposed}
    return StepCost(total, breakdown, busy, serial.bound, hidden, serial.accepted_tokens)
