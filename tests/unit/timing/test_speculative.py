"""Speculative decoding (MTP): the acceptance model, the draft layers' cost, and MTP off = today."""

from __future__ import annotations

import pytest

from rackserve.timing import TimingModel
from rackserve.timing.spec import load_model, parse_model
from rackserve.timing.speculative import draft_model, expected_accepted, speculation, verify_batch

from .conftest import bare, decode_step, scenarios


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
    # the time per output token falls by most of the accepted length (2.49 since issue 31: the
    # AgentX golden value, no longer the 3.65 the per-position rates gave; hence 0.6, not 0.5)
    off = vr200.with_optimizations("rubin-optimized,-mtp")
    tpot_off = off.step_time("decode", tp8, one).total_s
    assert cost.total_s / cost.accepted_tokens < 0.6 * tpot_off


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
    bare = load_model("deepseek-v3").model_copy(update={"mtp": None})  # a model without draft layers
    plain = TimingModel.create(model="deepseek-v3")
    none = TimingModel(plain.hardware, bare, plain.requested_optimizations)
    assert none.speculation is None and "draft layers" in none.skipped_switches["mtp"]
    assert not none.optimizations.mtp


def test_deepseek_v3_runs_its_mtp_module():
    """DeepSeek-V3 / R1 speculate with their one MTP module (3 drafts, TensorRT-LLM nextn 3): the
    switch is kept, a step keeps the spec's (fitted) acceptance length, the rates alone give 3.16, and the
    draft is one full MoE layer."""
    v3 = TimingModel.create(hardware="gb200", model="deepseek-v3", optimizations="baseline")
    assert v3.optimizations.mtp and "mtp" not in v3.skipped_switches
    assert v3.verify_tokens == 4
    assert v3.expected_accepted_tokens() == pytest.approx(load_model("deepseek-v3").mtp.acceptance_length)
    assert expected_accepted(load_model("deepseek-v3").mtp.acceptance) == pytest.approx(1 + 0.87 + 0.87 * 0.81 + 0.87 * 0.81 * 0.83)
    draft = draft_model(load_model("deepseek-v3"), layers=1)
    assert (draft.layers, draft.moe.experts, draft.moe.top_k, draft.moe.first_dense_layers) == (1, 256, 8, 0)
    off = v3.with_optimizations("baseline,-mtp")
    wide = v3.layout("dep", 16)
    one = decode_step(16, 64, 1024)
    per_token = v3.decode_token_time(wide, one).total_s
    assert per_token < off.step_time("decode", wide, one).total_s  # MTP pays at a small batch


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
    # the AgentX golden acceptance length (issue 31; 3.64506883 from the per-position rates before)
    assert per.breakdown["mtp_draft"] == pytest.approx(spec.breakdown["mtp_draft"] / 2.49)
    off = vr200.with_optimizations("rubin-optimized,-mtp")
    assert off.decode_token_time(wide, one) == off.step_time("decode", wide, one)


# ---- issue 31: acceptance as a benchmark parameter, drafting pass by pass, mixed steps, KV reads ----


def test_acceptance_length_defaults_to_the_agentx_golden_value_and_is_a_parameter():
    """The default is the length the AgentX harness pins for DeepSeek-V4 (2.49), not the 3.645 the
    per-position rates give; timing.speculative.acceptance_length replaces it."""
    from rackserve.config import TimingSection
    from rackserve.timing.speculative import rates_for_length

    tm = TimingModel.create()
    assert tm.expected_accepted_tokens() == pytest.approx(2.49)
    rates = tm.speculation.acceptance
    assert expected_accepted(rates) == pytest.approx(2.49) and all(0 <= a <= 1 for a in rates)
    assert rates[0] / rates[1] == pytest.approx(0.87 / 0.81)  # the YAML's shape, scaled
    assert TimingModel.create(acceptance_length=3.2).expected_accepted_tokens() == pytest.approx(3.2)
    section = TimingSection.model_validate({"speculative": {"acceptance_length": 1.7}})
    assert TimingModel.from_section(section).expected_accepted_tokens() == pytest.approx(1.7)
    assert rates_for_length([0.9, 0.8], 3.0) == (1.0, 1.0)
    with pytest.raises(ValueError, match="acceptance_length"):
        rates_for_length([0.9, 0.8], 3.5)


def test_sampled_acceptance_has_the_length_as_mean_and_shrinks_with_steps():
    import numpy as np

    from rackserve.timing.speculative import request_acceptance

    spec = TimingModel.create().speculation
    rng = np.random.default_rng(0)
    short = [request_acceptance(spec, 4, rng) for _ in range(4000)]
    long = [request_acceptance(spec, 400, rng) for _ in range(4000)]
    assert np.mean(short) == pytest.approx(2.49, rel=0.02) and np.mean(long) == pytest.approx(2.49, rel=0.01)
    assert np.std(short) > 5 * np.std(long) > 0
    assert min(short) >= 1.0 and max(short) <= spec.verify_tokens


def test_drafting_is_priced_pass_after_pass(vr200):
    """The drafts come one after another: a one-layer pass over the verify block, then
    draft_tokens - 1 one-token passes (vLLM eagle.py propose), not one parallel pass of all layers."""
    from rackserve.timing.speculative import draft_batches

    tp8 = vr200.layout("tp8")
    batch = verify_batch(decode_step(1, 1, 32768), vr200.verify_tokens)
    passes = draft_batches(batch, vr200.speculation.draft_tokens)
    assert len(passes) == 4 and passes[0] is batch
    assert all(int(p.ranks[0].new_tokens[0]) == 1 for p in passes[1:])
    quiet = vr200.hardware.model_copy(update={"step_overhead_s": 0.0})  # drafts run in the step's graph
    one_layer = TimingModel(quiet, draft_model(vr200.model, layers=1),
                            vr200.optimizations.with_switch("mtp", False))
    want = sum(one_layer.step_time("decode", tp8, p).total_s for p in passes)
    cost = vr200.speculative_step_time(tp8, batch)
    assert cost.breakdown["mtp_draft"] == pytest.approx(want)
    # four sequential passes pay four launches and weight streams of a draft layer, more than one
    # parallel one-layer pass over the same positions
    assert cost.breakdown["mtp_draft"] > 3 * one_layer.step_time("decode", tp8, batch).total_s


def _with_newcomers(dp: int, batch: int, context: int, newcomers: int, tail: int):
    """decode_step with `newcomers` sequences of each rank computing their `tail` + first token."""
    import numpy as np

    from rackserve.timing import RankBatch, StepBatch

    new = np.ones(batch, dtype=np.int64)
    cached = np.full(batch, context - 1, dtype=np.int64)
    new[:newcomers] += tail
    cached[:newcomers] -= tail
    rb = RankBatch(new, cached)
    return StepBatch(tuple(rb for _ in range(dp)))


def test_a_newcomer_step_keeps_speculation_for_the_running_sequences(vr200):
    """Issue 31 item 1: a step that newcomers join is a mixed step. The running sequences keep
    draft + verify, so per lazy-clock token the step costs the plain per-token time plus only the
    newcomers' own tail work: TPOT at a fixed batch does not depend on how many join beyond that.
    (Before, any such step was a plain, non-speculative step: ~2.5x the per-token time.)"""
    wide = vr200.layout("wide-ep", ranks=8)
    plain = vr200.decode_token_time(wide, decode_step(8, 64, 32768)).total_s
    one = vr200.decode_token_time(wide, _with_newcomers(8, 64, 32768, 1, 1)).total_s
    assert 0.95 * plain <= one < 1.1 * plain  # a 1-token tail + first token: 2 positions, not 5
    # the extra time grows with the newcomers' tail work, about linearly, not by a step's worth
    extra = [vr200.decode_token_time(wide, _with_newcomers(8, 64, 32768, k, 32)).total_s - plain for k in (1, 2, 4)]
    assert 0 < extra[0] < extra[1] < extra[2] < 6 * extra[0]
    # the running sequences' accepted tokens take exactly the mixed step: head + (A - 1) settled steps
    mixed_batch = _with_newcomers(8, 64, 32768, 4, 32)
    head = vr200.decode_token_time(wide, mixed_batch).total_s
    mixed = vr200.speculative_step_time(wide, verify_batch(mixed_batch, vr200.verify_tokens)).total_s
    settled = vr200.speculative_step_time(wide, verify_batch(decode_step(8, 64, 32768), 5)).total_s
    a = vr200.expected_accepted_tokens()
    assert head + (a - 1) * settled / a == pytest.approx(mixed, rel=1e-9)


def test_verify_positions_read_a_sequences_kv_once():
    """Issue 31 item 3: the verify block's positions share their sequence's window and compressed
    KV; the bytes are read once per sequence, the FLOPs stay per position: the attention kernel's
    memory time of a 5-position verify step is about the single-token step's (was 5x), its compute
    time 5x. (With 64 heads in BF16 this attention is compute-bound, so the step moves only where
    load and math do not overlap fully: baseline kernels, here ~10% of the attention time.)"""
    from rackserve.timing.attention_cost import kv_attention
    from rackserve.timing.batch_features import step_arrays
    from rackserve.timing.parts import Parts

    tm = bare(TimingModel.create(optimizations="baseline"))
    ctx, wide = tm._ctx, tm.layout("wide-ep", ranks=8)
    one = decode_step(8, 256, 120_000)
    parts = []
    for batch in (one, verify_batch(one, 5)):
        p = Parts(8)
        kv_attention(ctx, wide, "decode", ctx.groups["decode"], 0, step_arrays(batch.ranks, "decode", ctx.model, ctx.codes)[0], p)
        parts.append(p)
    assert parts[1].tm["attention"][0] == pytest.approx(parts[0].tm["attention"][0], rel=0.02)
    assert parts[1].tc["attention"][0] == pytest.approx(5 * parts[0].tc["attention"][0], rel=1e-3)  # positions 1 apart
    # old pricing (bytes per position): t = 5 tc + 0.5 x 5 tm; now 5 tc + 0.5 x tm
    a5 = tm.step_time("decode", wide, verify_batch(one, 5)).breakdown["attention"]
    old = 5 * parts[0].tc["attention"][0] + 0.5 * 5 * parts[0].tm["attention"][0]
    assert a5 < 0.95 * old
    # reference and fast paths agree on the verify step; prefill keeps its per-query pricing
    ref = tm.step_time_reference("decode", wide, verify_batch(one, 5))
    assert tm.step_time("decode", wide, verify_batch(one, 5)).total_s == pytest.approx(ref.total_s, rel=1e-6)
    from .conftest import prefill_step

    dep2 = tm.layout("dep2")
    pre = prefill_step(2, 2048, 6144)
    assert tm.step_time("prefill", dep2, pre).total_s == pytest.approx(
        tm.step_time_reference("prefill", dep2, pre).total_s, rel=1e-6)
