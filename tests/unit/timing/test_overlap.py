"""Two-micro-batch overlap of EP dispatch/combine with the other half's compute."""

from __future__ import annotations

import numpy as np
import pytest

from rackserve.timing import RankBatch, StepBatch, StepCost
from rackserve.timing.overlap import overlapped, split_in_two

from .conftest import decode_step, prefill_step


def test_split_keeps_every_position_once():
    batch = StepBatch((RankBatch.of([1] * 5, [10, 20, 30, 40, 50]), RankBatch.of([9000], [100])))
    a, b = split_in_two(batch)
    assert [r.new_tokens.tolist() for r in a.ranks] == [[1, 1, 1], [4500]]
    assert [r.new_tokens.tolist() for r in b.ranks] == [[1, 1], [4500]]
    assert b.ranks[0].cached_tokens.tolist() == [40, 50]
    assert b.ranks[1].cached_tokens.tolist() == [4600]  # the prompt's second half follows its first
    assert split_in_two(StepBatch((RankBatch.of([1], [5]),))) is None
    mixed = RankBatch.of([3, 1, 4], [0, 7, 9])  # 8 tokens: the midpoint falls inside the third
    a, b = split_in_two(StepBatch((mixed,)))
    assert a.ranks[0].new_tokens.tolist() == [3, 1] and b.ranks[0].new_tokens.tolist() == [4]
    odd = RankBatch.of([3, 1, 5], [0, 7, 9])  # 9 tokens: 4 and 5
    a, b = split_in_two(StepBatch((odd,)))
    assert a.ranks[0].new_tokens.tolist() == [3, 1] and b.ranks[0].new_tokens.tolist() == [5]


def test_overlap_formula_by_hand():
    serial = StepCost(10.0, {"moe_gemm": 6.0, "dispatch_combine": 4.0}, (10.0,))
    half = StepCost(5.5, {"moe_gemm": 3.5, "dispatch_combine": 2.0}, (5.5,))
    # max(3.5 + 3.5 + 2/4, 2 + 2 + 3.5/4) = 7.5: 0.5 of 4.0 exposed, 3.5 hidden
    got = overlapped(serial, half, half, moe_layers=4)
    assert got.total_s == pytest.approx(7.5)
    assert got.breakdown == pytest.approx({"moe_gemm": 7.0, "dispatch_combine": 0.5})
    assert got.hidden_s == pytest.approx({"dispatch_combine": 3.5})
    slow = StepCost(9.0, {"moe_gemm": 7.0, "dispatch_combine": 2.0}, (9.0,))
    assert overlapped(serial, slow, slow, moe_layers=4) is serial  # does not pay: serial


def test_overlap_never_slower_than_serial_nor_faster_than_its_longest_part(vr200):
    serial = vr200.with_optimizations("rubin-optimized,-two-batch-overlap")
    wide, dep2 = vr200.layout("wide-ep", ranks=8), vr200.layout("dep2")
    cases = [("decode", wide, decode_step(8, b, 32768)) for b in (2, 16, 64, 256)]
    cases += [("prefill", dep2, prefill_step(2, n)) for n in (2048, 32768, 131072)]
    applied = 0
    for phase, lay, batch in cases:
        on, off = vr200.step_time(phase, lay, batch), serial.step_time(phase, lay, batch)
        assert on.total_s <= off.total_s * (1 + 1e-12)
        assert on.total_s == pytest.approx(sum(on.breakdown.values()))
        if not on.hidden_s:
            assert on == off
            continue
        applied += 1
        a, b = (serial.step_time(phase, lay, h) for h in split_in_two(batch))
        comm = a.breakdown["dispatch_combine"] + b.breakdown["dispatch_combine"]
        compute = a.total_s + b.total_s - comm - b.breakdown.get("host_overhead", 0.0)  # host work once a step
        assert on.total_s >= max(compute, comm) - 1e-15
        exposed_plus_hidden = on.breakdown["dispatch_combine"] + on.hidden_s["dispatch_combine"]
        assert exposed_plus_hidden == pytest.approx(comm)
    assert applied >= 2, "overlap never paid on any wide-EP/DEP2 case"


def test_no_overlap_without_expert_parallelism(vr200):
    cost = vr200.step_time("decode", vr200.layout("tp8"), decode_step(1, 64, 8192))
    assert not cost.hidden_s and "dispatch_combine" not in cost.breakdown
    assert np.isfinite(cost.total_s)
