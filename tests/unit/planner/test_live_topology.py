"""services/topology.running_at_start: what a worker starts with under a planner (issue 52)."""

import pytest

from rackserve.config import Config
from services.topology import running_at_start

DEPLOYMENT = {"prefill": [{"layout": "dep2", "count": 3}], "decode": [{"layout": "wide-ep", "ranks": 4, "count": 2}]}


def test_without_a_planner_every_instance_runs():
    cfg = Config.model_validate({"deployment": DEPLOYMENT})
    assert [s.name for s in running_at_start(cfg, "prefill")] == ["prefill-dep2-0", "prefill-dep2-1", "prefill-dep2-2"]


def test_a_planner_starts_its_initial_counts_then_its_max_counts():
    cfg = Config.model_validate({"deployment": DEPLOYMENT, "planner": {"initial_prefill": 1, "max_decode": 1}})
    assert [s.name for s in running_at_start(cfg, "prefill")] == ["prefill-dep2-0"]
    assert [s.name for s in running_at_start(cfg, "decode")] == ["decode-wide-ep-0"]


def test_more_initial_instances_than_built_is_a_clear_error():
    cfg = Config.model_validate({"deployment": DEPLOYMENT, "planner": {"initial_decode": 5}})
    with pytest.raises(ValueError, match="planner.initial_decode: 5 is more than the 2"):
        running_at_start(cfg, "decode")


def test_a_bad_planner_field_is_named_at_load():
    with pytest.raises(ValueError, match="tick_s"):
        Config.model_validate({"planner": {"tick_s": -1}})
