import gzip
import json

from rackserve.workload.build import build_source, trace_workload
from rackserve.workload.spec import AgentXTraceWorkload, MooncakeWorkload, parse_workload
from rackserve.workload.trace_replay import TraceReplaySource
from tests.unit.workload.conversations import chain


def test_trace_file_becomes_the_workload_its_content_says(tmp_path):
    convs = tmp_path / "t.jsonl.gz"
    convs.write_bytes(gzip.compress((json.dumps(chain(3)) + "\n").encode()))
    moon = tmp_path / "m.jsonl"
    moon.write_text(json.dumps({"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}) + "\n")
    synthetic = parse_workload({"kind": "agentx", "concurrency": 40, "sessions": 9, "duration_s": 300, "seed": 3})
    wl = trace_workload(convs, synthetic)
    assert isinstance(wl, AgentXTraceWorkload)
    assert (wl.concurrency, wl.duration_s, wl.seed, wl.trace) == (40, 300, 3, str(convs))
    short = trace_workload(convs, synthetic.model_copy(update={"duration_s": 30.0}))
    assert short.measure_start_s == 0.0  # the default 60 s window start would not fit a 30 s run
    assert isinstance(trace_workload(moon, synthetic), MooncakeWorkload)
    src = build_source(wl, 64, "m")
    assert isinstance(src, TraceReplaySource) and len(src.start()) == 40


def test_trace_keeps_every_field_of_a_conversation_scenario(tmp_path):
    """Issue 31 item 7: scenario + `--trace F` equals the scenario with `trace: F` (warmup_first,
    start ratios, window, limit... were dropped: 0 completions at 4,800 lanes where the scenario's
    own file set completed 2,332)."""
    convs = tmp_path / "t.jsonl.gz"
    convs.write_bytes(gzip.compress((json.dumps(chain(3)) + "\n").encode()))
    fields = {"kind": "agentx-trace", "seed": 5, "concurrency": 4800, "warmup_first": True, "duration_s": 960,
              "measure_start_s": 60, "measure_s": 600, "start_ratio_min": 0.1, "start_ratio_max": 0.2,
              "think_time_cap_s": 5.0, "limit": 7, "start_stagger_s": 2.0}
    scenario = parse_workload({**fields, "trace": "other.jsonl.gz"})
    assert trace_workload(convs, scenario) == parse_workload({**fields, "trace": str(convs)})
