"""The fast speculative step (TimingModel.speculative_step_time: shared context sums, the one-token
draft passes priced together) against the pass-by-pass reference (speculative_step_time_by_passes:
step_time of the verify batch and of every draft batch): the same bits in every field, on the
simulator's representative batches and random ones, every layout, idle ranks, pool tokens, shared
rank batches, mixed steps, expert loads; and the block-wise context sums against the row-wise ones."""

from __future__ import annotations

import numpy as np
import pytest

from rackserve.sim.step_cache import (
    _decode_representative,
    _mixed_representative,
    _tail_representative,
)
from rackserve.timing import RankBatch, StepBatch, TimingModel
from rackserve.timing import step_plan as sp
from rackserve.timing.optimizations import parse_optimizations
from rackserve.timing.spec import load_hardware, load_model, parse_model
from rackserve.timing.speculative import settled_batch, verify_batch
from tests.unit.timing.cost_bits import cost_bits as _bits

LAYOUTS = (("wide-ep", 48), ("wide-ep", 16), ("wide-ep", 8), ("wide-ep", 2), ("tp8", None), ("dep2", None))




def _pair(tm_args) -> tuple[TimingModel, TimingModel]:
    """(fast, reference): two models of their own (no memo shared); the reference's speculative
    step is the pass-by-pass one, also inside decode_token_time, verify_step_time, mixed_token_time."""
    fast, ref = TimingModel(*tm_args), TimingModel(*tm_args)
    ref.speculative_step_time = ref.speculative_step_time_by_passes  # type: ignore[method-assign]
    return fast, ref


def _default():
    return (load_hardware("vr200"), load_model("deepseek-v4.1-flash"), parse_optimizations("rubin-optimized"))


def _variant(block_tokens: int, code: int, experts: int | None = None):
    data = load_model("deepseek-v4.1-flash").model_dump()
    data["name"] = f"v4.1-block{block_tokens}-code{code}"
    data["mtp"].update(block_tokens=block_tokens, draft_attention_code=code,
                       acceptance=[0.87, 0.81, 0.83, 0.83, 0.8, 0.8][: block_tokens - 1], acceptance_length=None)
    if experts:
        data["mtp"]["experts"] = experts
    return (load_hardware("vr200"), parse_model(data), parse_optimizations("rubin-optimized"))


def _random_batch(rng, dp: int, kind: int, experts: int) -> StepBatch:
    ranks: list[RankBatch] = []
    for _ in range(dp):
        if kind % 7 == 2 and ranks and rng.random() < 0.6:  # ranks sharing one batch
            ranks.append(ranks[int(rng.integers(0, len(ranks)))])
            continue
        n = int(rng.integers(0, 4)) if kind % 4 == 0 else int(rng.integers(0, 2)) if kind % 4 == 1 else int(rng.integers(1, 40))
        if kind % 5 == 3:
            new = rng.integers(1, 6, n)  # verify blocks and chunks
        elif kind % 5 == 4:
            new = np.where(rng.random(n) < 0.2, rng.integers(2, 300, n), 1)  # newcomers' tails
        else:
            new = np.ones(n, dtype=np.int64)
        cached = rng.integers(0, 200_000, n) if kind % 3 else rng.integers(0, 300, n)
        hbm = int(rng.integers(0, 3)) * 777 if kind % 3 == 1 else 0
        dram = int(rng.integers(0, 3)) * 555 if kind % 3 == 2 else 0
        ranks.append(RankBatch(new.astype(np.int64), cached.astype(np.int64), hbm, dram))
    load = None
    if kind % 6 == 5:
        load = rng.integers(0, 50, experts).astype(float)
        load[rng.random(experts) < 0.3] = 0
    return StepBatch(tuple(ranks), load)


def _representatives(rng, dp: int) -> list[StepBatch]:
    """The step memo's representative batches (sim/step_cache.py) of random signatures."""
    out = []
    for _ in range(4):
        active = int(rng.integers(1, dp + 1))
        total = int(rng.integers(active, active * 30 + 1))
        busiest = int(rng.integers(-(-total // active), total + 1))
        ctx = int(rng.choice([0, 1, 127, 128, 129, 4000, 70_000]))
        plain = _decode_representative(dp, active, total, busiest, ctx)
        out.append(plain)
        filled = sum(1 for rb in plain.ranks if rb.num_seqs)
        out.append(_tail_representative(dp, active, total, busiest, ctx, int(rng.integers(1, filled + 1)),
                                        int(rng.integers(1, 200))))
    sigs = []
    for _ in range(dp):
        n = int(rng.integers(0, 6))
        sigs.append((0, 0, 0, 0, 0, 0) if n == 0 else
                    (n, int(rng.integers(n, 20 * n)), int(rng.integers(0, 50_000)), int(rng.choice([0, 640])), 0,
                     int(rng.integers(0, n + 1))))
    out.append(StepBatch(tuple(_mixed_representative(*s) for s in sorted(sigs))))
    one = StepBatch((RankBatch.of([1], [77]),) + tuple(RankBatch.of([]) for _ in range(dp - 1)))
    last = StepBatch(tuple(RankBatch.of([]) for _ in range(dp - 1)) + (RankBatch.of([1, 1, 1], [5, 128, 9999]),))
    pooled = StepBatch(tuple(RankBatch.of([1] * k, [130 + 3 * j for j in range(k)], pool_hbm_tokens=64 * k)
                             for k in range(dp)))
    empty = StepBatch(tuple(RankBatch.of([]) for _ in range(dp)))
    return [*out, one, last, pooled, empty]


def _check(fast: TimingModel, ref: TimingModel, lay, batch: StepBatch, label) -> None:
    spec = fast.speculation
    cases = [
        ("speculative", lambda tm: tm.speculative_step_time(lay, batch)),
        ("speculative widened", lambda tm: tm.speculative_step_time(lay, verify_batch(batch, spec.verify_tokens))),
        ("decode_token_time", lambda tm: tm.decode_token_time(lay, batch)),
        ("verify_step_time", lambda tm: tm.verify_step_time(lay, batch)),
    ]
    if not batch.single_token:
        cases.append(("mixed_token_time", lambda tm: tm.mixed_token_time(lay, batch)))
        cases.append(("mixed_token_time settled", lambda tm: tm.mixed_token_time(
            lay, batch, tm.verify_step_time(lay, settled_batch(batch)))))
    for name, price in cases:
        try:
            want = _bits(price(ref))
        except ValueError as e:  # an expert load the draft model cannot take: the same error
            with pytest.raises(ValueError, match=str(e)[:40]):
                price(fast)
            continue
        assert _bits(price(fast)) == want, (label, name)


@pytest.mark.parametrize("name,ranks", LAYOUTS)
def test_fast_speculative_step_is_the_pass_by_pass_one_to_the_bit(name, ranks):
    fast, ref = _pair(_default())
    lay_f, lay_r = fast.layout(name, ranks), ref.layout(name, ranks)
    assert lay_f == lay_r
    rng = np.random.default_rng(7 + lay_f.dp)
    batches = _representatives(rng, lay_f.dp)
    batches += [_random_batch(rng, lay_f.dp, kind, fast.model.moe.experts) for kind in range(24)]
    for i, batch in enumerate(batches):
        _check(fast, ref, lay_f, batch, (lay_f.key, i))


@pytest.mark.parametrize("model", [(2, 0, None), (3, 2, None), (7, 0, None), (5, 0, 384)])
def test_fast_speculative_step_other_drafts(model):
    """Other draft shapes: one draft (no one-token pass), two and six drafts, a draft attention code
    with an indexer, and draft experts as many as the target's (so an expert load prices)."""
    fast, ref = _pair(_variant(*model))
    rng = np.random.default_rng(3)
    for name, ranks in (("wide-ep", 16), ("tp8", None)):
        lay = fast.layout(name, ranks)
        batches = [_random_batch(rng, lay.dp, kind, fast.model.moe.experts) for kind in range(12)]
        for i, batch in enumerate(batches + _representatives(rng, lay.dp)[:4]):
            _check(fast, ref, lay, batch, (model, lay.key, i))


@pytest.mark.parametrize("opt", ["baseline,+mtp", "rubin-optimized,-attn-overlap,-kv-gather-ahead",
                                 "rubin-optimized,-two-batch-overlap"])
def test_fast_speculative_step_other_switches(opt):
    fast, ref = _pair((load_hardware("vr200"), load_model("deepseek-v4.1-flash"), parse_optimizations(opt)))
    rng = np.random.default_rng(5)
    lay = fast.layout("wide-ep", 8)
    for i, batch in enumerate(_representatives(rng, lay.dp)[:6] + [_random_batch(rng, 8, k, 384) for k in range(8)]):
        _check(fast, ref, lay, batch, (opt, i))


def test_block_wise_context_sums_are_the_row_wise_ones():
    """_general_features (blocks of rows, features_together's batches laid end to end) gives the
    bits of the row-by-row _general_features_by_row, segment by segment."""
    rng = np.random.default_rng(9)
    plans = []
    for model in ("deepseek-v4.1-flash", "deepseek-v3"):
        tm = TimingModel.create("vr200", model, "rubin-optimized")
        for phase in ("decode", "prefill"):
            plans += [gp for lay in (tm.layout("wide-ep", 8), tm.layout("tp8")) for gp in tm._plan(lay, phase).groups]
    for gp in plans:
        for trial in range(60):
            counts = rng.integers(0, 5, int(rng.integers(1, 6)))
            n = int(counts.sum())
            new = rng.integers(0, [2, 6, 300, 20_000][trial % 4], n)
            cached = rng.integers(0, [10, 130, 5000, 300_000][trial // 4 % 4], n)
            q, end = new.astype(float), (cached + new).astype(float)
            if gp.tail:
                q = np.minimum(q, gp.tail)
            starts, nonempty = np.cumsum(counts) - counts, counts > 0
            got = sp._general_features(gp, q, end, starts, nonempty)
            assert got.tobytes() == sp._general_features_by_row(gp, q, end, starts, nonempty).tobytes()
        # several batches at once: each as alone (last ranks of 7 to 18 sequences: a sum of 8 or
        # more terms is pairwise, so a batch's last rank must keep its zero column's term)
        for _ in range(8):
            batches = []
            for _ in range(3):
                counts = [*rng.integers(0, 11, 3), int(rng.integers(7, 19))]
                batches.append(StepBatch(tuple(RankBatch(rng.integers(1, 9, c), rng.integers(0, 90_000, c)) for c in counts)))
            alone = [sp.Prepared(b.ranks).features(gp) for b in batches]
            preps = [sp.Prepared(b.ranks) for b in batches]
            sp.features_together(preps, [gp])
            for a, p in zip(alone, preps, strict=True):
                assert p.features(gp).tobytes() == a.tobytes()


def _big_batch(rng, dp: int) -> StepBatch:
    """~1,000 one-token sequences per rank: where H200's overlapped halves beat the serial step."""
    return StepBatch(tuple(RankBatch(np.ones(n, dtype=np.int64), rng.integers(0, 100_000, n))
                           for n in rng.integers(900, 1100, dp)))


@pytest.mark.parametrize("hw,name,ranks,big", [("vr200", "wide-ep", 8, False), ("vr200", "wide-ep", 48, False),
                                               ("vr200", "tp8", None, False), ("h200", "wide-ep", 8, True)])
def test_one_token_passes_priced_together_are_step_time_to_the_bit(hw, name, ranks, big):
    """_draft_passes on a target model itself (a one-layer draft's overlapped halves never win;
    a 61-layer model's do on H200 at ~1,000 sequences per rank): each pass as step_time prices
    draft_batches' batch, halves and overlap included."""
    from rackserve.timing.speculative import draft_batches

    tm = TimingModel.create(hw, optimizations="rubin-optimized,+mtp,+two-batch-overlap")
    lay = tm.layout(name, ranks)
    rng = np.random.default_rng(11)
    won = 0
    for kind in range(4 if big else 30):
        batch = _big_batch(rng, lay.dp) if big else _random_batch(rng, lay.dp, kind if kind % 6 != 5 else 0, 384)
        if not any(rb.num_seqs for rb in batch.ranks):
            continue
        passes = draft_batches(batch, 4)[1:]
        want = [tm.step_time("decode", lay, b) for b in passes]
        got = tm._draft_passes(lay, batch, sp.Prepared(batch.ranks), 3)
        for g, w in zip(got, want, strict=True):
            assert (g[0].hex(), [x.hex() for x in g[1]], {k: v.hex() for k, v in g[2].items()}) == (
                w.total_s.hex(), [x.hex() for x in w.rank_busy_s], {k: v.hex() for k, v in w.hidden_s.items()}), kind
            won += bool(w.hidden_s)
    assert won or not big  # the overlapped branch was taken
