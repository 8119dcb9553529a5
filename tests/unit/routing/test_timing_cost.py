"""TimingCost: the router's tabulated prefill estimate stays within 3% of TimingModel's own."""

from __future__ import annotations

import random

import pytest

from rackserve.config import Config, DeploymentSection, InstanceGroup
from rackserve.routing.timing_cost import CACHED_GRID, NEW_GRID, PrefillTable, TimingCost
from rackserve.timing import TimingModel


@pytest.fixture(scope="module")
def model() -> TimingModel:
    return TimingModel.create()


@pytest.fixture(scope="module")
def cost(model) -> TimingCost:
    return TimingCost(model)


def test_grid_points_are_exact_and_between_them_within_3_percent(model, cost):
    dep2 = model.layout("dep2")
    for n, c in [(NEW_GRID[5], CACHED_GRID[2]), (NEW_GRID[-1], 0), (1, CACHED_GRID[-1])]:
        assert cost.prefill_estimate_s("dep2", n, c) == pytest.approx(
            model.prefill_estimate_s(dep2, n, c), rel=1e-12
        )
    rng = random.Random(7)
    for _ in range(12):
        n = int(2 ** rng.uniform(0, 17))
        c = rng.choice([0, int(2 ** rng.uniform(8, 20))])
        want = model.prefill_estimate_s(dep2, n, c)
        assert cost.prefill_estimate_s("dep2", n, c) == pytest.approx(want, rel=0.03), (n, c)
    assert cost.prefill_estimate_s("dep2", 0, 5000) == 0.0


def test_more_new_or_cached_tokens_never_cost_less(cost):
    grid = [(n, c) for n in (64, 512, 4096, 32768) for c in (0, 2048, 65536)]
    for n, c in grid:
        assert cost.prefill_estimate_s("dep2", 2 * n, c) > cost.prefill_estimate_s("dep2", n, c)
        assert cost.prefill_estimate_s("dep2", n, 2 * c + 1) >= cost.prefill_estimate_s(
            "dep2", n, c
        )


def test_layout_names_and_transfer(model):
    tc = TimingCost(model)
    wide16 = model.layout("wide-ep", 16)
    table = PrefillTable(model, wide16, new_grid=(1, 1000, 4000), cached_grid=(0, 8000))
    assert table(1000, 0) == pytest.approx(model.prefill_estimate_s(wide16, 1000, 0))
    assert tc.layout_of("wide-ep16") == wide16 and tc.layout_of("tp8") == model.layout("tp8")
    for tier in ("pool_hbm", "pool_dram"):
        assert tc.kv_transfer_s(4096, tier) == model.kv_transfer_s(4096, tier)
    assert tc.kv_transfer_s(4096, "pool_dram") > tc.kv_transfer_s(4096, "pool_hbm")


def test_from_config_uses_the_deployment_layouts(model):
    cfg = Config(
        deployment=DeploymentSection(prefill=[InstanceGroup(layout="wide-ep", ranks=4)], decode=[])
    )
    tc = TimingCost.from_config(cfg, model)
    assert tc.layout_of("wide-ep") == model.layout("wide-ep", 4)


def test_a_prefill_layout_is_not_priced_as_the_decode_group_of_the_same_name(model):
    """Keyed by name only, the 16-rank wide-ep decode group overwrote the 4-rank wide-ep prefill
    one: the prefill was priced on 16 ranks."""
    cfg = Config(
        deployment=DeploymentSection(
            prefill=[InstanceGroup(layout="wide-ep", ranks=4)],
            decode=[InstanceGroup(layout="wide-ep", ranks=16)],
        )
    )
    tc = TimingCost.from_config(cfg, model)
    wide4, wide16 = model.layout("wide-ep", 4), model.layout("wide-ep", 16)
    assert tc.layout_of("wide-ep") == wide4 and tc.layout_of("wide-ep", "decode") == wide16
    n, c = NEW_GRID[-1], CACHED_GRID[0]  # long prompts: the all-to-all over 4 vs 16 ranks differs
    assert tc.prefill_estimate_s("wide-ep", n, c) == pytest.approx(
        model.prefill_estimate_s(wide4, n, c), rel=1e-12
    )
    assert model.prefill_estimate_s(wide4, n, c) != pytest.approx(
        model.prefill_estimate_s(wide16, n, c), rel=0.02
    )  # the two prices differ: the test can tell them apart


def test_two_prefill_groups_of_one_name_need_their_key(model):
    cfg = Config(
        deployment=DeploymentSection(
            prefill=[InstanceGroup(layout="wide-ep", ranks=4), InstanceGroup(layout="wide-ep", ranks=8)],
            decode=[],
        )
    )
    tc = TimingCost.from_config(cfg, model)
    with pytest.raises(ValueError, match="wide-ep4.*wide-ep8"):
        tc.layout_of("wide-ep")
    assert tc.layout_of("wide-ep8") == model.layout("wide-ep", 8)
