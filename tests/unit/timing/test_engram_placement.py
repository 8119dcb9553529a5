"""Engram placement (timing.engram_placement): HBM-sharded tables vs a host-DRAM copy per CPU. Capacity
and the row fetch move by what the specs say, computed here from the spec numbers."""

import pytest

from rackserve.config import load_config
from rackserve.timing.batch import RankBatch, StepBatch
from rackserve.timing.capacity import derive_capacity, engram_bytes_total
from rackserve.timing.engram_placement import host_fetch_bw
from rackserve.timing.layout import make_layout
from rackserve.timing.spec import load_hardware, load_model
from rackserve.timing.timing_model import TimingModel

MODEL = load_model("deepseek-v4.1-flash")
RACK = [(make_layout("dep2"), 12)], [(make_layout("wide-ep", 48), 1)]  # 24 + 48 GPUs, 18 trays, 36 CPUs


@pytest.mark.parametrize("hw_name", ["gb300", "vr200"])
def test_host_copy_frees_the_hbm_shard_and_takes_a_copy_per_cpu_from_the_dram_tier(hw_name):
    hw = load_hardware(hw_name)
    table = sum(MODEL.engram.table_rows) * MODEL.engram.row_bytes  # REFERENCE: ~94.4 GiB each
    assert table == engram_bytes_total(MODEL) == pytest.approx(2 * 94.4 * 2**30, rel=2e-3)
    sharded = derive_capacity(MODEL, hw, *RACK)
    host = derive_capacity(MODEL, hw, *RACK, engram_placement="host-copy")
    for a, b in ((sharded.prefill[0], host.prefill[0]), (sharded.decode[0], host.decode[0])):
        assert a.memory.engram_bytes == pytest.approx(table / 72, rel=1e-12)
        assert b.memory.engram_bytes == 0.0
        assert b.memory.kv_bytes - a.memory.kv_bytes == pytest.approx(table / 72, rel=1e-9)
    # prefill: the freed shard becomes prefix-cache tokens
    gained = host.prefill[0].kv_tokens - sharded.prefill[0].kv_tokens
    assert gained == pytest.approx(table / 72 / MODEL.kv_bytes_per_token, abs=1)
    # decode keeps its slot budget and lends the freed shard to the spare-HBM tier (48 lender GPUs)
    assert host.decode[0].kv_tokens == sharded.decode[0].kv_tokens
    assert host.pool_hbm.capacity_bytes - sharded.pool_hbm.capacity_bytes == pytest.approx(48 * table / 72, rel=1e-9)
    # one copy per CPU each instance spans: 12 DEP2 x 1 CPU + Wide-EP 48 over 48 / 2 CPUs = 36 copies
    gpus_per_cpu = hw.gpus_per_tray // hw.cpus_per_tray
    copies = 12 * (2 // gpus_per_cpu) + 48 // gpus_per_cpu
    assert copies == 36  # every CPU of the NVL72 rack (36 Grace / Vera CPUs)
    assert sharded.pool_dram.capacity_bytes - host.pool_dram.capacity_bytes == pytest.approx(copies * table, rel=1e-9)


@pytest.mark.parametrize("hw_name", ["gb300", "vr200"])
def test_exposed_row_fetch_moves_from_nvlink_to_the_cpu_gpu_link(hw_name):
    hw = load_hardware(hw_name)
    eg = MODEL.engram
    # Engram at layer 0 only: nothing runs before it, so the whole fetch is exposed and comparable
    model = MODEL.model_copy(update={"engram": eg.model_copy(update={"layers": [0]})})
    tokens = 8192
    fetched = tokens * eg.rows_per_token * eg.row_bytes
    costs = {}
    for placement in ("hbm-sharded", "host-copy"):
        tm = TimingModel(hw, model, TimingModel.create(hw_name, optimizations="baseline").optimizations,
                         engram_placement=placement)
        batch = StepBatch(tuple(RankBatch.of([tokens]) for _ in range(2)))
        costs[placement] = tm.step_time_reference("prefill", tm.layout("dep2"), batch)
    nvlink = hw.nvlink_bw_bytes_per_s * hw.efficiency.nvlink
    per_gpu_of_cpu = min(hw.host_link_bw_bytes_per_s,
                         hw.host_dram_bw_bytes_per_s * hw.cpus_per_tray / hw.gpus_per_tray) * hw.efficiency.nvlink
    assert host_fetch_bw(hw) == pytest.approx(per_gpu_of_cpu, rel=1e-12)
    delta = costs["host-copy"].breakdown["engram"] - costs["hbm-sharded"].breakdown["engram"]
    assert delta == pytest.approx(fetched / per_gpu_of_cpu - fetched / nvlink, rel=1e-6)
    assert delta > 0  # the CPU-GPU path is the slower one on both racks
    assert costs["host-copy"].total_s - costs["hbm-sharded"].total_s == pytest.approx(delta, rel=1e-6)


def test_reference_rack_hides_the_host_fetch_behind_the_prefetch():
    """With Engram at layers 1 and 14 the rows (issued at step start) arrive before the layer needs
    them on both paths, so only the per-layer kernel overhead is charged either way."""
    tms = [TimingModel.create("gb300", optimizations="baseline", engram_placement=p) for p in ("hbm-sharded", "host-copy")]
    batch = StepBatch(tuple(RankBatch.of([8192]) for _ in range(2)))
    a, b = (tm.step_time("prefill", tm.layout("dep2"), batch) for tm in tms)
    assert a.breakdown["engram"] == b.breakdown["engram"] == pytest.approx(2 * tms[0].hardware.microarch.kernel_overhead_s)


def test_a_bad_placement_is_a_value_error_naming_it(tmp_path):
    with pytest.raises(ValueError, match="engram_placement"):
        TimingModel.create("vr200", engram_placement="hbm")
    with pytest.raises(ValueError, match="engram_placement"):
        derive_capacity(MODEL, load_hardware("vr200"), *RACK, engram_placement="dram")
    path = tmp_path / "bad.yaml"
    path.write_text("timing: {engram_placement: host}\n")
    with pytest.raises(ValueError, match="timing.engram_placement"):
        load_config(path, environ={})


def test_a_copy_that_does_not_fit_one_cpu_says_so():
    hw = load_hardware("gb300").model_copy(update={"host_dram_bytes_per_tray": 0.3e12})
    with pytest.raises(ValueError, match="host-copy on gb300.*exceeds a CPU's usable host DRAM"):
        derive_capacity(MODEL, hw, *RACK, engram_placement="host-copy")
