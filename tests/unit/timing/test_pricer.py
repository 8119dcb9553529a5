"""The compiled step pricer (timing/_pricer.c via timing/pricer.py) against its numpy twins (step_plan.KERNELS):
to 1e-12 relative, kernel by kernel and as whole step costs, on property-generated batches and on every
step each golden scenario prices (tests/unit/sim/test_sim_golden.py)."""

from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rackserve.sim.run import timing_for
from rackserve.timing import RankBatch, StepBatch, StepCost, TimingModel, pricer
from rackserve.timing import step_assemble as sa
from rackserve.timing import step_cost as sc
from rackserve.timing import step_plan as sp

pytestmark = pytest.mark.skipif(not pricer.AVAILABLE, reason="timing/_pricer.c not built (no C compiler)")

REL = 1e-12
MODELS = (("vr200", "deepseek-v4.1-flash", "rubin-optimized"), ("h200", "deepseek-v3", "rubin-optimized"),
          ("gb200", "deepseek-v4-flash", "baseline"))
LAYOUTS = (("dep2", None), ("tp8", None), ("wide-ep", 8))
PRICED = ("step_time", "decode_token_time", "mixed_token_time", "verify_step_time", "prefill_estimate_s")


@contextmanager
def twins():
    """step_plan, step_assemble and step_cost (token bundles) price with their numpy twins inside (the reference)."""
    chosen = [(mod, name, getattr(mod, name)) for mod in (sp, sa, sc) for name in mod.KERNELS]
    try:
        for mod in (sp, sa, sc):
            for name, (twin, _) in mod.KERNELS.items():
                setattr(mod, name, twin)
        yield
    finally:
        for mod, name, kernel in chosen:
            setattr(mod, name, kernel)


def close(a: float, b: float) -> bool:
    return a == b or abs(a - b) <= REL * max(abs(a), abs(b)) or (math.isnan(a) and math.isnan(b))


def mismatches(got, want, where: str = "") -> list[str]:
    """Where two StepCosts (or floats, or arrays) differ by more than REL relative (labels exactly)."""
    if isinstance(want, StepCost):
        out = [] if list(got.breakdown) == list(want.breakdown) else [f"{where} breakdown keys"]
        out += [] if got.bound == want.bound else [f"{where} bound {got.bound} != {want.bound}"]
        pairs = [("total_s", got.total_s, want.total_s), ("accepted", got.accepted_tokens, want.accepted_tokens)]
        pairs += [(k, got.breakdown.get(k, math.nan), v) for k, v in want.breakdown.items()]
        pairs += [(f"hidden {k}", got.hidden_s.get(k, math.nan), v) for k, v in want.hidden_s.items()]
        pairs += [(f"busy {i}", g, w) for i, (g, w) in enumerate(zip(got.rank_busy_s, want.rank_busy_s, strict=True))]
        return out + [f"{where} {n}: {g!r} != {w!r}" for n, g, w in pairs if not close(float(g), float(w))]
    if isinstance(want, np.ndarray):
        return [f"{where}[{i}]" for i, (g, w) in enumerate(zip(got.ravel(), want.ravel(), strict=True))
                if not close(float(g), float(w))]
    return [] if close(float(got), float(want)) else [f"{where}: {got!r} != {want!r}"]


def ranks_strategy(dp: int, decode: bool):
    seqs = st.integers(0, 6)
    new = st.just(1) if decode else st.integers(1, 20_000)
    rank = seqs.flatmap(lambda n: st.tuples(st.lists(new, min_size=n, max_size=n),
                                            st.lists(st.integers(0, 300_000), min_size=n, max_size=n),
                                            st.sampled_from([0, 0, 777, 64 * 40]), st.sampled_from([0, 0, 555])))
    return st.lists(rank, min_size=dp, max_size=dp)


def batch_of(ranks) -> StepBatch:
    return StepBatch(tuple(RankBatch(np.array(n, dtype=np.int64), np.array(c, dtype=np.int64), h, d)
                           for n, c, h, d in ranks))


def priced(tm_args, name: str, ranks, phase: str, how: str):
    tm = TimingModel.create(*tm_args)
    lay = tm.layout(*name)
    batch = batch_of(ranks)
    if how == "speculative" and tm.speculation is not None:
        return tm.speculative_step_time(lay, batch)
    if how == "token" and tm.speculation is not None:
        return tm.decode_token_time(lay, batch)
    return tm.step_time(phase, lay, batch)


@pytest.mark.parametrize("tm_args", MODELS)
@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize("phase,how", [("prefill", "step"), ("decode", "step"), ("decode", "speculative"),
                                       ("decode", "token")])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_step_costs_match_the_numpy_twins(tm_args, name, phase, how, data):
    dp = TimingModel.create(*tm_args).layout(*name).dp
    single = how != "step" or data.draw(st.booleans())
    ranks = data.draw(ranks_strategy(dp, phase == "decode" and single))
    got = priced(tm_args, name, ranks, phase, how)
    with twins():
        want = priced(tm_args, name, ranks, phase, how)
    assert not mismatches(got, want, f"{name} {phase} {how}")


@settings(max_examples=200, deadline=None)
@given(counts=st.lists(st.integers(0, 40), min_size=1, max_size=16), seed=st.integers(0, 2**32 - 1),
       decode=st.booleans())
def test_kernels_match_the_numpy_twins(counts, seed, decode):
    """Each kernel alone, on every group plan of a model with indexer codes, a window and tail groups."""
    rng = np.random.default_rng(seed)
    tm = TimingModel.create("vr200", "deepseek-v4.1-flash", "rubin-optimized")
    counts_a = np.array(counts, dtype=np.int64)
    n = int(counts_a.sum())
    starts = (np.cumsum(counts_a) - counts_a).astype(np.intp)
    nonempty = counts_a > 0
    new = np.ones(n, dtype=np.int64) if decode else rng.integers(1, 20_000, n)
    cached = rng.integers(0, 400_000, n)
    q, end = new.astype(np.float64), (cached + new).astype(np.float64)
    for phase in ("prefill", "decode"):
        plan = tm._plan(tm.layout("dep2"), phase)
        for gp in plan.groups:
            qq = np.minimum(q, gp.tail) if gp.tail else q
            f = sp._general_features(gp, qq, end, starts, nonempty)
            assert not mismatches(pricer.general_features(gp, qq, end, starts, nonempty), f, "features")
            ref, got = sp._group_result(gp, f), pricer.group_result(gp, f)
            assert not mismatches(got.kv, ref.kv, "kv")
            assert not mismatches(got.cm, np.stack([ref.cm_row(r) for r in range(len(counts))]), "cm")
        if phase == "decode":
            gp = plan.groups[0]
            active = None if nonempty.all() else nonempty
            if n:
                assert not mismatches(pricer.decode_totals(gp, cached, starts, active),
                                      sp._decode_totals(gp, cached, starts, active), "decode")
                rows = np.stack([cached, cached + 1, cached + 2])
                assert not mismatches(pricer.decode_pass_totals(gp, rows, starts, active),
                                      sp._decode_pass_totals(gp, rows, starts, active), "passes")
        else:
            items = [(int(rng.integers(0, len(plan.groups))), RankBatch(new[s:s + c], cached[s:s + c]))
                     for s, c in zip(starts.tolist(), counts, strict=True)]
            assert not mismatches(pricer.rank_rows(plan, items), sp._rank_rows(plan, items), "rank rows")


@settings(max_examples=200, deadline=None)
@given(ranks=st.integers(1, 16), groups=st.integers(1, 3), seed=st.integers(0, 2**32 - 1), transfer=st.booleans(),
       idle=st.booleans())
def test_critical_rank_matches_the_numpy_twin(ranks, groups, seed, transfer, idle):
    rng = np.random.default_rng(seed)
    scale = 0.0 if idle else 1e-3
    kvs = [rng.random((ranks, 8))[:, 2:4] * scale for _ in range(groups)]  # strided, as prefill rows give them
    attn = [rng.random(ranks) * scale for _ in range(groups)]
    moe = [rng.random(ranks) * scale for _ in range(groups)]
    tr = rng.random(ranks) * scale if transfer else None
    got, want = pricer.critical(kvs, tr, attn, moe), sa._critical(kvs, tr, attn, moe)
    assert got[:4] == want[:4]
    assert got[4].tobytes() == want[4].tobytes()
    total = float(rng.random() * 3e-3)
    assert pricer.busy(got[4], total) == sa._busy(want[4], total)


BUNDLE_LAYOUTS = (("dep2", None), ("tp8", None), ("wide-ep", 8), ("wide-ep", 24))


@pytest.mark.parametrize("tm_args", MODELS)
@pytest.mark.parametrize("draft", [False, True])
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), idle=st.floats(0.0, 1.0), scale=st.sampled_from([8, 300, 20_000]))
def test_token_bundles_match_the_numpy_twin(tm_args, draft, seed, idle, scale):
    """The compiled token bundle (timing/bundle_plan.py) against step_cost's numpy one, every layer group
    of both phases on each layout: every component's times, the critical EP rank's, totals and labels."""
    tm = TimingModel.create(*tm_args)
    if draft:
        if tm.speculation is None:
            return
        tm = tm._draft_model()
    ctx, rng = tm._ctx, np.random.default_rng(seed)
    for name in BUNDLE_LAYOUTS:
        lay = tm.layout(*name)
        tokens = rng.integers(0, scale, lay.dp) * (rng.random(lay.dp) >= idle)
        seqs = np.minimum(tokens, rng.integers(1, 9, lay.dp)).astype(np.float64)
        tokens = tokens.astype(np.float64)
        for phase in ("prefill", "decode"):
            lg = ctx.groups[phase]
            for gi in (0, 1):
                if lg.layers[gi] == 0:
                    continue
                want = sc._numpy_bundle(ctx, lay, phase, lg, gi, tokens, seqs)
                got = sc._compiled_bundle(ctx, lay, phase, lg, gi, tokens, seqs)
                where = f"{lay.key} {phase} {gi}"
                for part in ("t", "tc", "tm"):
                    g, w = getattr(got.parts, part), getattr(want.parts, part)
                    assert list(g) == list(w), f"{where} {part} names"
                    for key, value in w.items():
                        assert not mismatches(g[key], value, f"{where} {part} {key}")
                assert got.crit_bound == want.crit_bound and list(got.crit_breakdown) == list(want.crit_breakdown)
                for key, value in want.crit_breakdown.items():
                    assert not mismatches(got.crit_breakdown[key], value, f"{where} crit {key}")
                assert not mismatches(got.attn_total, want.attn_total, f"{where} attention total")
                assert not mismatches(got.moe_total, want.moe_total, f"{where} MoE total")
                for r in range(lay.dp):
                    assert got.rank_tail(r)[1] == want.rank_tail(r)[1]


class Recorder:
    """A TimingModel whose priced calls are kept, with their results, as the step memo makes them."""

    def __init__(self, tm: TimingModel) -> None:
        self.tm = tm
        self.calls: list[tuple[str, tuple, object]] = []

    def __getattr__(self, name: str):
        attr = getattr(self.tm, name)
        if name not in PRICED:
            return attr

        def record(*args):
            result = attr(*args)
            self.calls.append((name, args, result))
            return result

        return record


@pytest.mark.parametrize("name", ["agentx", "agentx-lazy", "mooncake", "preempt"])
def test_every_step_of_each_golden_matches_the_numpy_twins(name):
    """Each golden scenario's run (both policies) with the compiled pricer, every step it priced priced
    again by the numpy twins on a fresh model: the same to 1e-12."""
    from tests.unit.sim.test_sim_golden import figures, scenario

    timing = timing_for(scenario("mooncake"))  # the golden tests' one timing section
    timing.timing = recorder = Recorder(timing.timing)
    figures(name, timing)
    assert len(recorder.calls) > 50
    with twins():
        fresh = timing_for(scenario("mooncake")).timing
        bad = [m for i, (method, args, result) in enumerate(recorder.calls)
               for m in mismatches(getattr(fresh, method)(*args), result, f"call {i} {method}")]
    assert not bad, f"{len(bad)} of {len(recorder.calls)} calls differ:\n" + "\n".join(bad[:20])
