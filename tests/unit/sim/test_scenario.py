import re
from pathlib import Path

import pytest

from rackserve.sim.scenario import load_scenario
from rackserve.workload.spec import AgentXTraceWorkload, MooncakeWorkload

SCENARIOS = sorted(p for p in (Path(__file__).parents[3] / "scenarios").glob("*.yaml") if p.name != "local.yaml")


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_shipped_scenarios_load(path):
    sc = load_scenario(path)
    assert sc.name == path.stem and sc.gpus > 0
    if isinstance(sc.workload, MooncakeWorkload):
        assert Path(sc.workload.trace).is_file()


def test_the_required_scenarios_exist():
    by_name = {p.stem: load_scenario(p) for p in SCENARIOS}
    assert by_name["nvl72-vr200"].gpus == by_name["nvl72-gb300"].gpus == 72
    assert by_name["nvl72-gb300"].config.timing.hardware == "gb300"
    assert sum(g.count for g in by_name["dep2x12"].config.deployment.prefill) == 12
    for name in ("nvl72-vr200", "nvl72-gb300", "agentx-3dep2-wideep", "dep2x12"):  # the real traces by default
        wl = by_name[name].workload
        assert isinstance(wl, AgentXTraceWorkload) and Path(wl.trace).is_file()
        assert wl.measure_window == (60.0, 960.0)  # a 900 s measured window, as AgentX
    assert by_name["tp8-batch1"].sim.decode_max_batch_seqs == 1


BASE = """
deployment:
  prefill: [{layout: dep2, count: 1}]
  decode: [{layout: wide-ep, ranks: 4, count: 1}]
workload: {kind: uniform, requests: 2, prompt_tokens: 100, output_tokens: 5}
"""


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (BASE + "sim: {prefill_chunk_tokens: 0}\n", "sim.prefill_chunk_tokens"),
        (BASE + "sim: {chunk: 5}\n", "sim.chunk"),
        (BASE.replace("layout: dep2", "layout: dep3"), "deployment.prefill.0.layout"),
        (BASE.replace("ranks: 4", "ranks: 0"), "deployment.decode.0.ranks"),
        (BASE.replace("requests: 2", "requests: -1"), "workload.requests"),
        (BASE.replace("kind: uniform", "kind: agentx"), "workload.concurrency"),
        (BASE + "pool: {hbm_capacity_bytes: -5}\n", "pool.hbm_capacity_bytes"),
        (BASE.replace("count: 1}]\nworkload", "count: 0}]\nworkload"), "deployment.decode"),
    ],
)
def test_bad_scenario_names_the_field(tmp_path, text, field):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"bad\.yaml: .*" + re.escape(field)):
        load_scenario(path)
