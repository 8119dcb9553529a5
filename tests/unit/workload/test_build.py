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
