"""rackserve/validate/mapping.py: each setting of a row reaches the twin, and what cannot is said."""

from __future__ import annotations

import pytest

from rackserve.validate.mapping import map_point, read_layouts
from rackserve.validate.points import Point, read_points

BASE = dict(id="t", model="DeepSeek-R1-0528", hardware="GB200 NVL72", framework="Dynamo + TRT-LLM",
            precision="FP8", disagg=True, prefill_cfg="2 worker(s) x TP4/EP4, dp_attn=True; 8 GPUs total",
            decode_cfg="1 worker(s) x TP16/EP16, dp_attn=True; 16 GPUs total", mtp=False, isl=1024, osl=1024,
            concurrency=64, tput_per_gpu=1000.0, tps_user=50.0, ttft_s=1.0)


def mapped(**change):
    return map_point(Point(**{**BASE, **change}), {})


def test_workers_become_layouts():
    m = mapped()
    assert m.kind == "serving" and m.hardware == "gb200" and m.model == "deepseek-v3"
    assert (m.prefill.layout, m.prefill.gpus, m.prefill.count) == ("dep", 4, 2)
    assert (m.decode.layout, m.decode.gpus, m.gpus) == ("dep", 16, 24)
    tep = mapped(decode_cfg="4 worker(s) x TP8/EP8, dp_attn=False; 32 GPUs total")
    assert (tep.decode.layout, tep.decode.gpus, tep.decode.count, tep.decode.moe_tp) == ("tep", 8, 4, 1)
    split = mapped(decode_cfg="1 worker(s) x TP8/EP2, dp_attn=False")
    assert split.decode.moe_tp == 4 and split.decode.as_group() == {"layout": "tep", "ranks": 8, "count": 1, "moe_tp": 4}


def test_precision_mtp_and_hardware_reach_the_twin_or_are_named():
    fp4 = mapped(precision="FP4 (NVFP4 MoE)")
    assert fp4.expert_precision == "nvfp4" and fp4.attention_math == "fp8"
    assert any("FP8" in a and "attention" in a for a in fp4.approximations)
    assert mapped().expert_precision is None and mapped().attention_math is None
    hopper = mapped(hardware="H100 (HGX)", precision="FP4")
    assert hopper.hardware == "h100" and any("Hopper" in a for a in hopper.approximations)
    assert mapped(mtp=True).mtp and not mapped(mtp=False).mtp
    unstated = mapped(mtp=None)
    assert not unstated.mtp and any("MTP use not stated" in a for a in unstated.approximations)
    assert mapped(hardware="B200 (HGX, 8-GPU NVLink nodes)").hardware == "b200"
    assert mapped(hardware="H800").hardware == "h800" and mapped(hardware="GB300 NVL72").hardware == "gb300"


def test_aggregated_rows_are_one_instance():
    agg = mapped(disagg=False, prefill_cfg="single node TP8/EP8, dp_attn=True", decode_cfg="single node TP8/EP8, dp_attn=True")
    assert agg.kind == "aggregated" and agg.gpus == 8 and agg.decode.layout == "dep"
    assert "aggregated 1 x dep8" in agg.describe()


def test_an_aggregated_trtllm_row_runs_the_engine_inferencex_launched():
    """InferenceX's TRT-LLM scripts: ADP balance (timeout 60), max_num_tokens = decode tokens + ISL + 64
    rounded to 64 (>= 8192 without MTP), one MTP draft and concurrency / TP sequences per rank with MTP;
    the simulated scenario is one aggregated instance with those settings."""
    from rackserve.sim.aggregated import AggregatedSimulator
    from rackserve.sim.run import simulator_for
    from rackserve.sim.scenario import scenario_from_dict
    from rackserve.validate.run import scenario_of

    single = "single node TP8/EP8, dp_attn=True"
    plain = mapped(disagg=False, prefill_cfg=single, decode_cfg=single, framework="TRT-LLM", mtp=False,
                   isl=8192, concurrency=128)
    assert plain.engine == {"max_num_batched_tokens": 8384, "adp_balance_timeout_iters": 60}
    assert any("attention-DP balance" in a for a in plain.approximations)
    mtp = mapped(disagg=False, prefill_cfg=single, decode_cfg=single, framework="TRT-LLM", mtp=True,
                 isl=8192, concurrency=256)
    assert mtp.engine == {"max_num_batched_tokens": 8320, "decode_max_batch_seqs": 32, "drafts": 1,
                          "adp_balance_timeout_iters": 60}
    sc = scenario_from_dict(scenario_of(mtp), "t")
    assert simulator_for(sc) is AggregatedSimulator and sc.gpus == 8
    assert sc.config.timing.speculative.drafts == 1 and sc.sim.adp_balance_timeout_iters == 60
    assert mapped(disagg=False, prefill_cfg=single, decode_cfg=single, framework="SGLang").engine == {}


def test_what_cannot_be_expressed_says_why():
    v4 = mapped(model="DeepSeek-V4-Pro (1.6T)")
    assert v4.kind == "unexpressed" and "model spec" in v4.approximations[0]
    odd = mapped(hardware="MI355X")
    assert odd.kind == "unexpressed" and "MI355X" in odd.approximations[0]
    prose = mapped(prefill_cfg="a few nodes", decode_cfg="many GPUs")
    assert prose.kind == "unexpressed" and "cannot read the workers" in prose.approximations[0]


def test_every_row_of_the_projects_copy_is_expressed_or_says_why():
    readings = read_layouts()
    kinds = {}
    for p in read_points():
        m = map_point(p, readings)
        kinds[p.id] = m.kind
        if m.kind == "unexpressed":
            assert m.approximations, p.id
        else:
            assert m.gpus > 0 and (m.prefill or m.decode), p.id
        if p.id in readings and m.kind != "unexpressed":
            assert m.read_as, p.id  # a prose reading quotes what it read
    assert kinds["pub-27"] == "unexpressed"
    assert sum(k != "unexpressed" for k in kinds.values()) == 22
    assert {kinds["pub-17"], kinds["pub-20"]} == {"aggregated"}
    assert kinds["pub-29"] == "prefill-phase" and kinds["pub-37"] == "single-stream"


@pytest.mark.parametrize("pid", ["pub-37"])
def test_a_reading_can_carry_the_sources_acceptance(pid):
    p = next(r for r in read_points() if r.id == pid)
    m = map_point(p, read_layouts())
    assert m.acceptance_length == pytest.approx(3.1) and m.decode.moe_tp == 4
