"""Speculative decoding (MTP): the acceptance model, the draft layers' cost, and MTP off = today."""

from __future__ import annotations

import pytest

from rackserve.timing import TimingModel
from rackserve.timing.spec import load_model, parse_model
from rackserve.timing.speculative import draft_model, expected_accepted, speculation, verify_batch

from .conftest import decode_step, scenarios


def test_expected_accepted_tokens_by_hand():
    # 1 + 0.87 + 0.87 x 0.81 + 0.87 x 0.81 x 0.83 + 0.87 x 0.81 x 0.83 x 0.83
    assert expected_accepted([0.87, 0.81, 0.83, 0.83]) == pytest.approx(
        1 + 0.87 + 0.7047 + 0.584901 + 0.48546783
    )
    assert expected_accepted([]) == 1.0 and expected_accepted([1.0, 1.0]) == 3.0
    spec = speculation(load_model("deepseek-v4.1-flash"))
    assert spec.verify_tokens == 5 and spec.draft_tokens == 4
    dist = spec.accepted_distribution()
    assert dist.sum() == pytest.approx(1.0) and (dist >= 0).all()
    assert (dist * range(1, 6)).sum() == pytest.approx(spec.expected_accepted_tokens)


def test_mtp_off_equals_todays_decode(vr200):
    off = vr200.with_optimizations("rubin-optimized,-mtp")
    assert off.speculation is None and off.verify_tokens == 1
    assert off.expected_accepted_tokens() == 1.0
    for label, phase, lay, batch in scenarios(off):
        if phase != "decode":
            continue
        a, b = off.speculative_step_time(lay, batch), off.step_time("decode", lay, batch)
        assert a == b, label
        assert a.accepted_tokens == 1.0


def test_mtp_step_is_verify_plus_draft_and_emits_accepted_tokens(vr200):
    tp8 = vr200.layout("tp8")
    one = decode_step(1, 1, 32768)
    batch = verify_batch(one, vr200.verify_tokens)
    cost = vr200.speculative_step_time(tp8, batch)
    verify = vr200.step_time("decode", tp8, batch)
    assert cost.breakdown["mtp_draft"] > 0
    assert cost.total_s == pytest.approx(verify.total_s + cost.breakdown["mtp_draft"])
    assert cost.total_s == pytest.approx(sum(cost.breakdown.values()))
    assert cost.accepted_tokens == pytest.approx(vr200.expected_accepted_tokens())
    # three small draft layers cost a fraction of the 40-layer verify pass
    assert cost.breakdown["mtp_draft"] < 0.2 * verify.total_s
    # at batch 1 the verify pass of 5 positions costs about one step (weights stream once), so
    # the time per output token falls by most of the accepted length
    off = vr200.with_optimizations("rubin-optimized,-mtp")
    tpot_off = off.step_time("decode", tp8, one).total_s
    assert cost.total_s / cost.accepted_tokens < 0.5 * tpot_off


def test_mtp_gains_less_where_decode_is_compute_bound(vr200):
    off = vr200.with_optimizations("rubin-optimized,-mtp")
    wide = vr200.layout("wide-ep", ranks=8)

    def gain(b: int) -> float:
        one = decode_step(8, b, 8192)
        on = vr200.speculative_step_time(wide, verify_batch(one, vr200.verify_tokens))
        return off.step_time("decode", wide, one).total_s / (on.total_s / on.accepted_tokens)

    assert gain(1) > gain(256) > 1.0


def test_draft_model_has_the_reference_shape():
    draft = draft_model(load_model("deepseek-v4.1-flash"))
    assert (draft.layers, draft.moe.experts, draft.moe.top_k) == (3, 128, 3)
    assert draft.engram is None and draft.mtp is None and draft.prefill.full_layers == 3
    v3 = TimingModel.create(model="deepseek-v3")  # no draft layers in its spec
    assert v3.speculation is None and "draft layers" in v3.skipped_switches["mtp"]
    assert not v3.optimizations.mtp


def test_acceptance_rates_must_match_the_drafts():
    data = load_model("deepseek-v4.1-flash").model_dump()
    data["mtp"]["acceptance"] = [0.9, 0.8]
    with pytest.raises(ValueError, match="mtp.*acceptance"):
        parse_model(data)
    data["mtp"]["acceptance"] = [0.9, 0.8, 1.2, 0.5]
    with pytest.raises(ValueError, match="acceptance"):
        parse_model(data)


def test_decode_token_time_is_the_speculative_step_per_accepted_token(vr200):
    wide = vr200.layout("wide-ep", ranks=8)
    one = decode_step(8, 32, 16384)
    spec = vr200.speculative_step_time(wide, verify_batch(one, vr200.verify_tokens))
    per = vr200.decode_token_time(wide, one)
    assert per.total_s == pytest.approx(spec.total_s / spec.accepted_tokens)
    assert per.total_s == pytest.approx(sum(per.breakdown.values()))
    assert per.breakdown["mtp_draft"] == pytest.approx(spec.breakdown["mtp_draft"] / 3.64506883)
    off = vr200.with_optimizations("rubin-optimized,-mtp")
    assert off.decode_token_time(wide, one) == off.step_time("decode", wide, one)
    chunk = decode_step(8, 4, 1000)  # a recompute chunk in the step: no speculation there
    mixed = type(chunk)(tuple(type(rb)(rb.new_tokens * 3, rb.cached_tokens) for rb in chunk.ranks))
    assert vr200.decode_token_time(wide, mixed) == vr200.step_time("decode", wide, mixed)
