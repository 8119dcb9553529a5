"""Specs load into typed objects; bad specs fail at load with a message naming the field."""

from __future__ import annotations

import copy

import pytest
import yaml

from rackserve.timing import TimingModel, make_layout
from rackserve.timing.spec import (
    SPEC_DIR,
    available,
    load_hardware,
    load_model,
    parse_hardware,
    parse_model,
)


def _raw(kind: str, name: str) -> dict:
    return yaml.safe_load((SPEC_DIR / kind / f"{name}.yaml").read_text())


def test_every_spec_loads_and_every_numeric_line_has_a_source_comment():
    assert set(available("hardware")) >= {"vr200", "gb300", "gb200", "h200"}
    assert set(available("model")) >= {"deepseek-v4.1-flash", "deepseek-v3"}
    for kind in ("hardware", "model"):
        for name in available(kind):
            (load_hardware if kind == "hardware" else load_model)(name)
            for line in (SPEC_DIR / kind / f"{name}.yaml").read_text().splitlines():
                body = line.split("#")[0]
                value = body.split(":", 1)[1] if ":" in body else ""
                if any(ch.isdigit() for ch in value) and not body.startswith("name:"):
                    assert "#" in line, f"{kind}/{name}: no source comment on {line!r}"


def test_v41_flash_numbers_match_reference():
    m = load_model("deepseek-v4.1-flash")
    assert (m.vocab, m.hidden, m.layers, m.attention.heads, m.attention.qk_head_dim) == (
        129280,
        5120,
        40,
        64,
        512,
    )
    assert (m.moe.experts, m.moe.top_k, m.moe.intermediate) == (384, 6, 2304)
    # one routed FP4 expert: 3 x 5120 x 2304 weights at 0.53125 B (NVFP4 with per-16 scales)
    assert m.moe.expert_bytes == 3 * 5120 * 2304 * 0.53125 == 18_800_640
    codes = m.attention.layer_codes
    assert codes[:2] == [0, 0] and codes.count(2) == 18 and codes.count(1) == 20


def test_missing_field_is_named():
    data = _raw("hardware", "vr200")
    del data["hbm_bw_bytes_per_s"]
    with pytest.raises(ValueError, match="hbm_bw_bytes_per_s"):
        parse_hardware(data)


def test_negative_bandwidth_is_named():
    data = _raw("hardware", "gb300")
    data["nvlink_bw_bytes_per_s"] = -1.0
    with pytest.raises(ValueError, match="nvlink_bw_bytes_per_s"):
        parse_hardware(data)
    data = _raw("hardware", "gb300")
    data["efficiency"]["grouped_memory"] = 1.5
    with pytest.raises(ValueError, match="efficiency.grouped_memory"):
        parse_hardware(data)


def test_model_consistency_errors_are_named():
    data = _raw("model", "deepseek-v4.1-flash")
    bad = copy.deepcopy(data)
    bad["attention"]["layer_codes"] = bad["attention"]["layer_codes"][:-1]
    with pytest.raises(ValueError, match="layer_codes"):
        parse_model(bad)
    bad = copy.deepcopy(data)
    bad["attention"]["layer_codes"][5] = 7
    with pytest.raises(ValueError, match="layer_codes"):
        parse_model(bad)
    bad = copy.deepcopy(data)
    bad["moe"]["unexpected"] = 1
    with pytest.raises(ValueError, match="moe.unexpected"):
        parse_model(bad)


def test_unknown_names_fail_with_the_field():
    with pytest.raises(ValueError, match="layout: unknown layout 'dep4'"):
        make_layout("dep4")
    with pytest.raises(ValueError, match="ranks"):
        make_layout("tp8", ranks=4)
    with pytest.raises(ValueError, match="ranks"):
        make_layout("wide-ep", ranks=1)
    with pytest.raises(ValueError, match="hardware: unknown hardware spec 'b100'"):
        TimingModel.create(hardware="b100")
    with pytest.raises(ValueError, match="optimizations: unknown switch 'turbo'"):
        TimingModel.create(optimizations="baseline,+turbo")


def test_layouts_shape():
    assert (make_layout("dep2").dp, make_layout("dep2").ep) == (2, 2)
    wide = make_layout("wide-ep", ranks=72)
    assert (wide.gpus, wide.dp, wide.ep, wide.tp) == (72, 72, 72, 1)
    tp8 = make_layout("tp8")
    assert (tp8.gpus, tp8.dp, tp8.tp, tp8.trays) == (8, 1, 8, 2)


def test_from_config_section():
    from rackserve.config import TimingSection
    from rackserve.timing.optimizations import SERVING_DEFAULTS

    tm = TimingModel.from_section(TimingSection(hardware="gb300", optimizations="baseline"))
    assert (
        tm.hardware.name == "gb300"
        and tm.optimizations.enabled() == list(SERVING_DEFAULTS)
        and tm.block_tokens == 64
    )


def test_v41_flash_kv_footprint_rederived_from_the_attention_spec():
    """REFERENCE: KV in HBM about 890 B per token; the spec's entry bytes and ratios must give it."""
    m = load_model("deepseek-v4.1-flash")
    # 20 CSA layers x (272 + 68) / 8 + 18 HCA layers x 272 / 128 = 850 + 38.25
    assert m.derived_kv_bytes_per_token() == pytest.approx(888.25)
    assert m.derived_kv_bytes_per_token() == pytest.approx(m.kv_bytes_per_token, rel=0.01)
    idx_layers = [i for i, c in enumerate(m.attention.layer_codes) if m.attention.codes[c].indexer]
    assert idx_layers == list(range(20, 40))  # the indexer runs on the 20 CSA layers, from layer 20
    assert m.mhc.elem_bytes == 4  # FP32 residual streams
    # the window buffer: 40 layers x 128 tokens x 527 B = REFERENCE's ~2.7 MB per request
    assert m.layers * m.attention.window * m.attention.window_entry_bytes == pytest.approx(
        m.window_buffer_bytes, rel=0.01
    )
