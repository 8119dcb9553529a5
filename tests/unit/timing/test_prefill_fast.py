"""The prefill fast path (step_plan._rank_rows: every rank row a step and its halves lack, computed
together; _assemble_one; the plan's token-bundle memo; prefill_estimate_s' reference step once per
layout; overlap._split) against the readable ones (_rank_row rank by rank, _assemble, the reference
step priced on every estimate, the halves split rank by rank): the same bits in every field."""

from __future__ import annotations

import numpy as np
import pytest

from rackserve.sim.step_cache import _decode_representative, _mixed_representative, _representative
from rackserve.timing import RankBatch, StepBatch, TimingModel, overlap
from rackserve.timing import step_plan as sp
from tests.unit.timing.cost_bits import cost_bits as _bits

MODELS = (("vr200", "deepseek-v4.1-flash"), ("h200", "deepseek-v3"), ("gb200", "deepseek-v4-flash"))
LAYOUTS = (("dep2", None), ("tp8", None), ("wide-ep", 8), ("wide-ep", 16))




def _rank(rng, kind: int) -> RankBatch:
    n = int(rng.integers(0, 3)) if kind % 4 == 0 else int(rng.integers(1, 12))
    new = rng.integers(1, [2, 6, 200, 130, 20_000][kind % 5], n)
    cached = rng.integers(0, [1, 129, 5000, 300_000][kind // 5 % 4], n)
    hbm = int(rng.integers(0, 3)) * 777 if kind % 3 == 1 else 0
    return RankBatch(new.astype(np.int64), cached.astype(np.int64), hbm)


def _batches(rng, dp: int, experts: int) -> list[StepBatch]:
    out = []
    for kind in range(20):
        ranks: list[RankBatch] = []
        for _ in range(dp):
            if ranks and kind % 7 == 2 and rng.random() < 0.5:  # ranks sharing one batch
                ranks.append(ranks[int(rng.integers(0, len(ranks)))])
            else:
                ranks.append(_rank(rng, kind))
        load = None
        if kind % 6 == 5:
            load = rng.integers(0, 50, experts).astype(float)
        out.append(StepBatch(tuple(ranks), load))
    for _ in range(4):  # the step memo's representatives (sim/step_cache.py)
        sigs = []
        for _ in range(dp):
            n = int(rng.integers(0, 4))
            sigs.append((0, 0, 0, 0, 0) if n == 0 else (
                n, int(rng.integers(n, 20_000)), int(rng.integers(0, 10**8)), int(rng.choice([0, 640])), 0))
        out.append(StepBatch(tuple(_representative(*s) for s in sorted(sigs))))
    out.append(StepBatch(tuple(RankBatch.of([]) for _ in range(dp))))  # every rank idle
    out.append(StepBatch((RankBatch.of([8192, 700], [0, 3000]),) + (RankBatch.of([8192]),) * (dp - 1)))
    return out


@pytest.mark.parametrize("hw,model", MODELS)
def test_rank_rows_together_are_rank_row_bits(hw, model):
    """_rank_rows of many (group, rank) pairs at once: each row the bits of _rank_row alone (its
    sequences' sums segment by segment, one vector-matrix product each)."""
    tm = TimingModel.create(hw, model, "rubin-optimized")
    rng = np.random.default_rng(21)
    for name, ranks in LAYOUTS:
        plan = tm._plan(tm.layout(name, ranks), "prefill")
        for trial in range(40):
            items = [(int(rng.integers(0, len(plan.groups))), _rank(rng, trial + j))
                     for j in range(int(rng.integers(1, 14)))]
            if trial % 5 == 0:
                items.append(items[0])  # the same rank batch twice
            got = sp._rank_rows(plan, items)
            for (gi, rb), row in zip(items, got, strict=True):
                assert row.tobytes() == sp._rank_row(plan.groups[gi], rb).tobytes(), (name, trial, gi)


def _reference_model(monkeypatch, tm_args):
    """A model whose prefill rows come rank by rank (_rank_row), whose one-group steps are assembled
    by _assemble, and whose prefill estimates price the reference step every time."""
    ref = TimingModel.create(*tm_args)
    monkeypatch.setattr(sp, "_rank_rows", lambda plan, items: np.stack([sp._rank_row(plan.groups[gi], rb)
                                                                        for gi, rb in items]))
    monkeypatch.setattr(sp, "_assemble_one", lambda g, b, transfer, lay: sp._assemble([g], [b], transfer, lay))

    def estimate(layout, new_tokens, cached_tokens):
        if new_tokens <= 0:
            return 0.0
        ref_rb = RankBatch.of([ref.reference_chunk_tokens])
        more = RankBatch.of([ref.reference_chunk_tokens, new_tokens], [0, cached_tokens])
        base = ref.step_time("prefill", layout, StepBatch((ref_rb,) * layout.dp)).total_s
        return max(ref.step_time("prefill", layout, StepBatch((more,) + (ref_rb,) * (layout.dp - 1))).total_s
                   - base, 0.0)

    ref.prefill_estimate_s = estimate  # type: ignore[method-assign]
    return ref


def _cases(tm, lay, batches, rng) -> list:
    out = []
    for b in batches:
        for phase in ("prefill", "decode"):
            try:
                out.append(_bits(tm.step_time(phase, lay, b)))
            except ValueError as e:  # an expert load of another length: the same error
                out.append(str(e))
    for _ in range(12):
        out.append(_bits(tm.prefill_estimate_s(lay, int(rng.choice([1, 64, 700, 9000, 40_000])),
                                               int(rng.choice([0, 64, 3000, 200_000])))))
    if tm.speculation is not None:
        dp = lay.dp
        for _ in range(3):
            active = int(rng.integers(1, dp + 1))
            total = int(rng.integers(active, active * 30 + 1))
            rep = _decode_representative(dp, active, total, int(rng.integers(-(-total // active), total + 1)), 4000)
            out.append(_bits(tm.decode_token_time(lay, rep)))
            sigs = [(0, 0, 0, 0, 0, 0) if n == 0 else (n, 12 * n, 20_000, 0, 0, int(rng.integers(0, n + 1)))
                    for n in rng.integers(0, 5, dp)]
            out.append(_bits(tm.mixed_token_time(lay, StepBatch(tuple(_mixed_representative(*s) for s in sorted(sigs))))))
    return out


@pytest.mark.parametrize("hw,model,opt", [("vr200", "deepseek-v4.1-flash", "rubin-optimized"),
                                          ("h200", "deepseek-v3", "rubin-optimized"),
                                          ("gb200", "deepseek-v4-flash", "baseline"),
                                          ("vr200", "deepseek-v4.1-flash", "rubin-optimized,-two-batch-overlap")])
def test_prefill_fast_path_is_the_rank_by_rank_one_to_the_bit(monkeypatch, hw, model, opt):
    fast = TimingModel.create(hw, model, opt)
    for name, ranks in LAYOUTS:
        lay = fast.layout(name, ranks)
        batches = _batches(np.random.default_rng(5), lay.dp, fast.model.moe.experts)
        want = None
        with monkeypatch.context() as m:
            ref = _reference_model(m, (hw, model, opt))
            want = _cases(ref, ref.layout(name, ranks), batches, np.random.default_rng(6))
        assert _cases(fast, lay, batches, np.random.default_rng(6)) == want, (name, ranks)


def test_prefill_rows_survive_a_memo_cleared_mid_step(monkeypatch):
    """A memo cleared while a step's rows are filled (the limit reached): the step is still priced
    with every row, the same bits."""
    fresh = TimingModel.create("vr200")
    lay = fresh.layout("dep2")
    rng = np.random.default_rng(8)
    batches = _batches(rng, lay.dp, fresh.model.moe.experts)[:10]
    want = [_bits(fresh.step_time("prefill", lay, b)) for b in batches]
    small = TimingModel.create("vr200")
    monkeypatch.setattr(sp, "MEMO_LIMIT", 3)
    assert [_bits(small.step_time("prefill", small.layout("dep2"), b)) for b in batches] == want
    for b in batches:  # and rank by rank, without the step's halves first
        assert _bits(small._fast("prefill", small.layout("dep2"), b)) == _bits(fresh._fast("prefill", lay, b))


def _split_by_rank(batch: StepBatch):
    """overlap._split as first written: rank by rank, ranks that share a batch share its halves."""
    made: dict = {}
    halves = []
    for rb in batch.ranks:
        h = made.get(id(rb))
        if h is None:
            h = made[id(rb)] = overlap._split_rank(rb)
        halves.append(h)
    a = tuple(h[0] for h in halves)
    b = tuple(h[1] for h in halves)
    if not any(rb.num_seqs for rb in b):
        return None
    experts = None if batch.expert_tokens is None else np.asarray(batch.expert_tokens) / 2.0
    return StepBatch(a, experts), StepBatch(b, experts)


def test_split_is_the_rank_by_rank_split():
    rng = np.random.default_rng(4)
    batches = _batches(rng, 8, 384) + _batches(rng, 1, 384)
    batches.append(StepBatch(tuple(RankBatch(np.ones(n, dtype=np.int64), rng.integers(0, 9000, n))
                                   for n in (0, 1, 2, 7, 7, 0, 3, 40))))
    for batch in batches:
        got, want = overlap._split(batch), _split_by_rank(batch)
        assert (got is None) == (want is None)
        if got is None:
            continue
        for g, w in zip(got, want, strict=True):
            assert (g.expert_tokens is None) == (w.expert_tokens is None)
            if g.expert_tokens is not None:
                assert g.expert_tokens.tobytes() == w.expert_tokens.tobytes()
            for x, y in zip(g.ranks, w.ranks, strict=True):
                assert (x.new_tokens.tobytes(), x.cached_tokens.tobytes(), x.pool_hbm_tokens, x.pool_dram_tokens) == (
                    y.new_tokens.tobytes(), y.cached_tokens.tobytes(), y.pool_hbm_tokens, y.pool_dram_tokens)
            # ranks that share a batch share its halves
            assert [[id(x) for x in g.ranks].index(id(x)) for x in g.ranks] == \
                [[id(rb) for rb in batch.ranks].index(id(rb)) for rb in batch.ranks]
