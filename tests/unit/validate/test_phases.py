"""rackserve/validate/phases.py: the phase checks obey the laws they are built on."""

from __future__ import annotations

import math

import pytest

from rackserve.validate import phases
from rackserve.validate.mapping import Mapped, Workers


def row(kind: str, **kw) -> Mapped:
    base = dict(id="t", kind=kind, hardware="h200", model="deepseek-v3", expert_precision=None, attention_math=None,
                mtp=False, prefill=None, decode=None, isl=8192, osl=1024, concurrency=128)
    return Mapped(**{**base, **kw})


def test_decode_at_speed_is_the_largest_batch_meeting_the_speed():
    m = row("decode-at-speed", decode=Workers("dep", 8), context_tokens=4096)
    fig = phases.decode_at_speed(m, 30.0)
    b = fig.detail["batch_per_rank"]
    tm = phases.timing_model(m)
    lay = phases.layout_of(tm, m.decode)
    assert phases.token_time(tm, lay, b, 4096) <= 1 / 30.0 < phases.token_time(tm, lay, b + 1, 4096)
    assert fig.tput_per_gpu == pytest.approx(b * 8 / phases.token_time(tm, lay, b, 4096) / 8)


def test_prefill_phase_is_a_full_chunk_per_rank():
    m = row("prefill-phase", prefill=Workers("dep", 8), context_tokens=2000)
    fig = phases.prefill_phase(m)
    assert fig.detail["prompts_per_rank"] == 4  # 8192 // 2000
    assert fig.tput_per_gpu == pytest.approx(4 * 2000 / fig.detail["step_s"])


def test_single_stream_is_one_over_the_batch_one_token_time():
    m = row("single-stream", decode=Workers("tep", 8, moe_tp=4), context_tokens=2048, mtp=True, hardware="b200",
            expert_precision="nvfp4")
    fig = phases.single_stream(m)
    assert math.isclose(fig.tps_user, 1.0 / fig.detail["token_time_s"])
    no_mtp = phases.single_stream(row("single-stream", decode=Workers("tep", 8, moe_tp=4), context_tokens=2048,
                                      hardware="b200", expert_precision="nvfp4"))
    assert fig.tps_user > 1.5 * no_mtp.tps_user  # 3 drafts pay at batch 1
