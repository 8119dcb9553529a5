"""A memo in front of the timing model: step costs looked up by a quantized batch signature.

The timing model prices a whole StepBatch (~10 ms a call on this machine); a run makes one call per
step or leap, and the router one per distinct prefix hit. The memo keys a rank's batch by (sequences,
new tokens, token-weighted mean context, pool tokens), each on a geometric grid of `rel` steps, and
prices a representative batch of that signature once: equal sequences at the mean context, so an
attention cost linear in context is kept exactly. bench/simulator/vs_dynamo.py measures the error against the exact
model on the same run. Decode ranks are summarized together (see `_decode_signature`); a decode
batch's per-rank busy times are those of the representative batch given back to the ranks by
sequence count (`_to_ranks`: both clocks, the simulator's and the live workers' services/step_memo).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rackserve.timing.batch import RankBatch, StepBatch, StepCost
from rackserve.timing.timing_model import per_token

EXACT_BELOW = 16  # values this small are kept exact (sequence counts of small batches)
MEMO_GRID = 1 << 17  # grid points remembered
MEMO_REMAP = 4096  # step costs remembered with their busy times mapped back to ranks
TAIL_REL = 0.25  # grid of the context for the tail step's ratio (decode_tail_step_time_of)


class GeometricGrid(dict):
    """x -> its grid point: x itself (rounded) up to EXACT_BELOW, else the nearest power of (1 + rel).
    A dict of the points met so far (values repeat: counts, token totals), so a call that finds its
    point is one C-level lookup (`grid(x)` is `grid[x]`); a new x is computed by `__missing__`."""

    def __init__(self, rel: float) -> None:
        super().__init__()
        assert rel > 0
        self._log = math.log1p(rel)
        self.rel = rel

    __call__ = dict.__getitem__

    def __missing__(self, x: float) -> int:
        if x <= EXACT_BELOW:
            v = int(round(x))
        else:
            v = int(round(math.exp(round(math.log(x) / self._log) * self._log)))
        if len(self) < MEMO_GRID:
            self[x] = v
        return v


class CachedTiming:
    """Same methods as rackserve.timing.TimingModel; step_time and prefill_estimate_s memoized."""

    def __init__(self, timing: Any, rel: float = 0.05) -> None:
        self.timing = timing
        self.grid = GeometricGrid(rel)
        self._steps: dict[tuple, StepCost] = {}
        self._estimates: dict[tuple, float] = {}
        self._remaps: dict[tuple, tuple[StepCost, StepCost]] = {}
        self._ratios: dict[tuple, float] = {}
        self._plains: dict[tuple, tuple[float, StepCost | None]] = {}
        self._coarse = GeometricGrid(TAIL_REL)
        self.calls = 0
        self.misses = 0
        # the step store's view (rackserve/sim/step_store.py): its file's (mtime, size) when last read
        # or written, and how many of the entries are in it
        self.store_stamp: tuple[int, int] | None = None
        self.stored_size = 0

    @property
    def speculation(self) -> Any:
        return self.timing.speculation

    def grid_params(self) -> tuple:
        """What the memo's keys depend on besides the cost model (part of a step store's fingerprint)."""
        return (self.grid.rel, self._coarse.rel, EXACT_BELOW)

    def entries(self) -> dict[str, dict]:
        """The memo's tables of priced steps (what rackserve/sim/step_store.py keeps on disk)."""
        return {"steps": self._steps, "estimates": self._estimates, "ratios": self._ratios, "plains": self._plains}

    def size(self) -> int:
        """Entries in the memo's tables (a step store saves when it grew)."""
        return len(self._steps) + len(self._estimates) + len(self._ratios) + len(self._plains)

    def absorb(self, entries: dict[str, dict]) -> int:
        """Add stored entries (StepStore.load) to the memo's tables; entries it holds stay. How many were new."""
        new = 0
        for name, table in self.entries().items():
            for key, value in entries.get(name, {}).items():
                if key not in table:
                    table[key] = value
                    new += 1
        return new

    def layout(self, name: str, ranks: int | None = None, moe_tp: int = 1) -> Any:
        return self.timing.layout(name, ranks=ranks, moe_tp=moe_tp)

    def pd_transfer_s(self, tokens: int) -> float:
        return self.timing.pd_transfer_s(tokens)

    def kv_transfer_s(self, tokens: int, tier: str) -> float:
        return self.timing.kv_transfer_s(tokens, tier)

    def prefill_estimate_s(self, layout: Any, new_tokens: int, cached_tokens: int) -> float:
        if new_tokens <= 0:
            return 0.0
        q_new, q_cached = self.grid(new_tokens), self.grid(cached_tokens)
        key = (getattr(layout, "key", layout), q_new, q_cached)
        value = self._estimates.get(key)
        if value is None:
            value = self._estimates[key] = self.timing.prefill_estimate_s(layout, q_new, q_cached)
        return value * new_tokens / q_new

    def step_time(self, phase: str, layout: Any, batch: StepBatch) -> StepCost:
        # single-token decode ranks are keyed as a whole; a rank with longer chunks (a recompute)
        # by its own tokens, as prefill ranks are
        if phase == "decode" and batch.single_token:
            self.calls += 1
            key = (phase, getattr(layout, "key", layout), self._decode_signature(batch))
            cost = self._steps.get(key)
            if cost is None:
                self.misses += 1
                cost = self._steps[key] = self.timing.step_time(phase, layout, _decode_representative(*key[2]))
            return self._to_ranks(cost, batch)
        return self.step_time_of(phase, layout, [_totals(rb) for rb in batch.ranks])

    def step_time_of(self, phase: str, layout: Any, ranks: list[tuple[int, int, int, int, int]]) -> StepCost:
        """step_time of a prefill step (or a decode step with longer chunks) given per rank as
        SchedulerOutput.totals() (sequences, new tokens, sum of new x cached tokens, pool HBM and
        DRAM tokens): no batch arrays needed."""
        self.calls += 1
        # ranks are interchangeable: key by the sorted signatures, map busy times back
        per_rank = [self._sig_of(*t) for t in ranks]
        order = sorted(range(len(per_rank)), key=per_rank.__getitem__)
        sig = tuple(map(per_rank.__getitem__, order))
        cost = self._priced(phase, layout, sig)
        if order != sorted(order) and len(cost.rank_busy_s) == len(order):
            cost = self._remap(cost, order)
        return cost

    def decode_tail_step_time_of(self, layout: Any, ranks: int, active: int, seqs: int, busiest: int,
                                 context_tokens: int, tails: list[int]) -> StepCost:
        """A lazy decode batch's step in which newcomers also compute their prompts' tails (tokens
        past the last full block, not handed over) with their first token while the running
        sequences keep draft + verify (timing.mixed_token_time, per token of the lazy clock). The
        batch's own pure decode step (decode_step_time_of: the key the leaps that follow use) scaled
        by how much the tails change a step, that ratio priced on a
        coarse representative (_TailShape: powers of two, context on a 25% grid) and memoized. An
        approximation (within a few % of the exact batch; see the tests): keyed rank by rank, a
        48-rank tail step rarely repeated, and keyed on the totals and tails at the memo's fine
        grid it still missed nine times in ten."""
        base = self.decode_step_time_of(layout, ranks, active, seqs, busiest, context_tokens, 0)
        shape = (ranks, _pow2(active, ranks), _pow2(busiest, busiest), self._coarse(float(context_tokens) / seqs),
                 _pow2(len(tails), active), _pow2(max(tails), max(tails)))
        key = ("decode-tail", getattr(layout, "key", layout), shape)
        ratio = self._ratios.get(key)
        if ratio is None:
            self.misses += 1
            r, a, b, ctx, tail_ranks, tail = shape
            plain, spec = self._tail_plain(layout, (r, a, a * b, b, ctx))
            rep = _tail_representative(r, a, a * b, b, ctx, tail_ranks, tail)
            if spec is not None and tail <= ctx:
                # the tailed batch settles to the plain representative's contents (each tail then
                # cached in full), so its settled step is the plain one's, priced already
                tailed = self.timing.mixed_token_time(layout, rep, spec)
            else:
                tailed = self.timing.decode_token_time(layout, rep)
            ratio = self._ratios[key] = tailed.total_s / plain
        return self._scaled(base, ratio)

    def _tail_plain(self, layout: Any, sig: tuple[int, int, int, int, int]) -> tuple[float, StepCost | None]:
        """The plain decode step of a tail ratio's coarse shape (no tails), memoized on the shape
        without the tails: ~15 tail shapes share one (a 1,000-lane minute: 1,562 ratios, 102 plain).
        With MTP also its speculative step before the division by accepted tokens."""
        key = ("decode-tail-plain", getattr(layout, "key", layout), sig)
        hit = self._plains.get(key)
        if hit is None:
            rep = _decode_representative(*sig)
            if getattr(self.timing, "speculation", None) is not None:
                spec = self.timing.verify_step_time(layout, rep)
                hit = (per_token(spec).total_s, spec)
            else:
                hit = (self.timing.decode_token_time(layout, rep).total_s, None)
            self._plains[key] = hit
        return hit

    def _scaled(self, cost: StepCost, ratio: float) -> StepCost:
        """`cost` with every component times `ratio`, one object per (cost, ratio)."""
        key = (id(cost), ratio)
        hit = self._remaps.get(key)
        if hit is not None:
            return hit[1]
        out = StepCost(cost.total_s * ratio, {k: v * ratio for k, v in cost.breakdown.items()},
                       tuple(map(ratio.__mul__, cost.rank_busy_s)), cost.bound)  # ratio * b == b * ratio
        if len(self._remaps) >= MEMO_REMAP:
            self._remaps.clear()
        self._remaps[key] = (cost, out)  # holding `cost` keeps its id unique
        return out

    def _priced(self, phase: str, layout: Any, sig: tuple) -> StepCost:
        """The memoized step_time of a batch of representative ranks with these signatures."""
        key = (phase, getattr(layout, "key", layout), sig)
        cost = self._steps.get(key)
        if cost is None:
            self.misses += 1
            rep = StepBatch(tuple(_representative(*s) for s in sig))
            cost = self._steps[key] = self.timing.step_time(phase, layout, rep)
        return cost

    def _remap(self, cost: StepCost, order: list[int]) -> StepCost:
        """`cost` with its busy times (listed in signature order) given back to the ranks of `order`."""
        key = (id(cost), tuple(order))
        hit = self._remaps.get(key)
        if hit is not None:
            return hit[1]
        busy = [0.0] * len(order)
        for pos, rank in enumerate(order):
            busy[rank] = cost.rank_busy_s[pos]
        out = StepCost(cost.total_s, cost.breakdown, tuple(busy), cost.bound)
        if len(self._remaps) >= MEMO_REMAP:
            self._remaps.clear()
        self._remaps[key] = (cost, out)  # holding `cost` keeps its id unique
        return out

    def decode_step_time(self, layout: Any, loads: list[tuple[int, int]], extra: int) -> StepCost:
        """decode_token_time(layout, batch) for ranks given as (sequences, context tokens), each
        sequence `extra` tokens further along, without building the batch (same key, same cost)."""
        counts = [n for n, _ in loads]
        total = sum(counts)
        return self.decode_step_time_of(layout, len(counts), sum(1 for c in counts if c), total, max(counts),
                                        sum(ctx for _, ctx in loads), extra)

    def decode_step_time_of(self, layout: Any, ranks: int, active: int, seqs: int, busiest: int,
                            context_tokens: int, extra: int) -> StepCost:
        """decode_step_time from the batch's totals: `seqs` sequences on `active` of `ranks` ranks,
        `busiest` on the fullest, `context_tokens` in all, each sequence `extra` tokens further."""
        self.calls += 1
        g = self.grid
        ctx = float(context_tokens + seqs * extra) / seqs if seqs else 0.0  # exact: integers below 2**53
        sig = (ranks, active, g(seqs), g(busiest), g(ctx))
        key = ("decode-token", getattr(layout, "key", layout), sig)
        cost = self._steps.get(key)
        if cost is None:
            self.misses += 1
            cost = self._steps[key] = self.timing.decode_token_time(layout, _decode_representative(*sig))
        return cost

    def decode_token_time(self, layout: Any, batch: StepBatch) -> StepCost:
        """timing.decode_token_time (per output token, MTP-aware), memoized by the decode signature;
        a batch with longer chunks (a newcomer's tail, a recompute) is a mixed step (_mixed_token_time)."""
        if not batch.single_token:
            return self._mixed_token_time(layout, batch)
        self.calls += 1
        key = ("decode-token", getattr(layout, "key", layout), self._decode_signature(batch))
        cost = self._steps.get(key)
        if cost is None:
            self.misses += 1
            cost = self._steps[key] = self.timing.decode_token_time(layout, _decode_representative(*key[2]))
        return self._to_ranks(cost, batch)

    def _mixed_token_time(self, layout: Any, batch: StepBatch) -> StepCost:
        """timing.decode_token_time of a mixed decode step (one-token sequences beside longer
        chunks), keyed per rank as prefill ranks are, plus the rank's count of one-token sequences:
        its representative keeps those at one token (they draft and verify) and spreads the rest."""
        self.calls += 1
        per_rank = [(*self._sig_of(*_totals(rb)), self.grid(int((rb.new_tokens == 1).sum()))) for rb in batch.ranks]
        order = sorted(range(len(per_rank)), key=per_rank.__getitem__)
        sig = tuple(per_rank[i] for i in order)
        key = ("decode-mixed", getattr(layout, "key", layout), sig)
        cost = self._steps.get(key)
        if cost is None:
            self.misses += 1
            rep = StepBatch(tuple(_mixed_representative(*s) for s in sig))
            cost = self._steps[key] = self.timing.decode_token_time(layout, rep)
        if order != sorted(order) and len(cost.rank_busy_s) == len(order):
            cost = self._remap(cost, order)
        return cost

    def _to_ranks(self, cost: StepCost, batch: StepBatch) -> StepCost:
        """A single-token decode batch is priced as its representative (busiest rank first, then
        the others by falling sequence count, _decode_representative): its busy times go back to
        the batch's ranks in that order (ties keep rank order), so each rank gets its own."""
        counts = [rb.num_seqs for rb in batch.ranks]
        if len(cost.rank_busy_s) != len(counts) or all(a >= b for a, b in zip(counts[:-1], counts[1:], strict=True)):
            return cost
        order = sorted(range(len(counts)), key=lambda r: -counts[r])  # stable
        return self._remap(cost, order)

    def _decode_signature(self, batch: StepBatch) -> tuple[int, int, int, int, int]:
        """Decode ranks are interchangeable in lockstep: (ranks, active ranks, sequences in all,
        on the busiest rank, mean context), so the memo stays small for wide-EP instances."""
        return self._decode_sig([rb.num_seqs for rb in batch.ranks],
                                [float(rb.cached_tokens.sum()) for rb in batch.ranks])

    def _decode_sig(self, counts: list[int], context: list[float]) -> tuple[int, int, int, int, int]:
        active = sum(1 for c in counts if c)
        total = sum(counts)
        ctx = sum(context) / total if total else 0.0
        g = self.grid
        return (len(counts), active, g(total), g(max(counts)), g(ctx))

    def _sig_of(self, n: int, total: int, dot: int, pool_hbm: int, pool_dram: int) -> tuple[int, int, int, int, int]:
        if n == 0:
            return (0, 0, 0, 0, 0)
        ctx = float(dot) / total if total else 0.0
        g = self.grid
        return (g(n), g(total), g(ctx), g(pool_hbm), g(pool_dram))


def _totals(rb: RankBatch) -> tuple[int, int, int, int, int]:
    n = rb.num_seqs
    if n == 0:
        return (0, 0, 0, 0, 0)
    return (n, rb.total_new, int(np.dot(rb.new_tokens, rb.cached_tokens)), rb.pool_hbm_tokens, rb.pool_dram_tokens)


def _decode_representative(ranks: int, active: int, total: int, busiest: int, ctx: int) -> StepBatch:
    """The busiest rank first, the other sequences spread evenly over the other active ranks."""
    busiest = min(busiest, total)
    rest, others = total - busiest, max(active - 1, 0)
    counts = [busiest] + [rest // others + (1 if i < rest % others else 0) for i in range(others)] if others else [busiest]
    counts += [0] * (ranks - len(counts))
    made: dict[int, RankBatch] = {}  # ranks of one count share one batch (the model only reads them)
    for c in counts:
        if c not in made:
            made[c] = RankBatch(np.ones(c, dtype=np.int64), np.full(c, ctx, dtype=np.int64))
    return StepBatch(tuple(made[c] for c in counts))


def _pow2(x: int, cap: int) -> int:
    """x to the nearest power of two (in log), at most `cap`."""
    return min(cap, 1 << round(math.log2(x))) if x > 0 else 0


def _tail_representative(ranks: int, active: int, total: int, busiest: int, ctx: int, tail_ranks: int,
                         tail: int) -> StepBatch:
    """_decode_representative with a `tail`-token tail on each of its first `tail_ranks` ranks,
    computed by the rank's first sequence (its context less the tail cached, as
    decode_side._decode_rank_batch lays a rank out)."""
    rep = _decode_representative(ranks, active, total, busiest, ctx)
    out = list(rep.ranks)
    for i in range(max(1, min(tail_ranks, active))):
        rb = out[i]
        new, cached = rb.new_tokens.copy(), rb.cached_tokens.copy()
        new[0] += tail
        cached[0] = max(0, int(cached[0]) - tail)
        out[i] = RankBatch(new, cached)
    return StepBatch(tuple(out))


def _mixed_representative(n: int, total: int, ctx: int, pool_hbm: int, pool_dram: int, singles: int) -> RankBatch:
    """_representative with `singles` of its sequences at one token (decoding), the others sharing
    the remaining tokens (at least two each: a tail or chunk with its token)."""
    singles = min(singles, n)
    rest, longer = max(total - singles, 2 * (n - singles)), n - singles
    if longer == 0:
        return RankBatch.of([1] * n, [ctx] * n, pool_hbm_tokens=pool_hbm, pool_dram_tokens=pool_dram)
    news = [1] * singles + [rest // longer + (1 if i < rest % longer else 0) for i in range(longer)]
    return RankBatch.of(news, [ctx] * n, pool_hbm_tokens=pool_hbm, pool_dram_tokens=pool_dram)


def _representative(n: int, total: int, ctx: int, pool_hbm: int, pool_dram: int) -> RankBatch:
    if n == 0:
        return RankBatch.of([])
    total = max(total, n)
    news = [total // n + (1 if i < total % n else 0) for i in range(n)]
    return RankBatch.of(news, [ctx] * n, pool_hbm_tokens=pool_hbm, pool_dram_tokens=pool_dram)
