"""Turn a validated workload spec into an ArrivalSource; `trace_workload` for `--trace FILE`."""

from __future__ import annotations

from pathlib import Path

from rackserve.workload.agentx import AgentXSource
from rackserve.workload.mooncake import read_trace, trace_requests
from rackserve.workload.source import ArrivalSource, ListSource
from rackserve.workload.spec import (
    AgentXTraceWorkload,
    AgentXWorkload,
    AnyWorkload,
    MooncakeWorkload,
    UniformWorkload,
)
from rackserve.workload.trace_file import read_conversations, trace_format
from rackserve.workload.trace_replay import TraceReplaySource
from rackserve.workload.uniform import UniformSource

DEFAULT_TRACE_LANES = 64  # --trace with a conversation file on an open-loop scenario


def build_source(spec: AnyWorkload, block_size: int, model_id: str) -> ArrivalSource:
    if isinstance(spec, MooncakeWorkload):
        records = read_trace(spec.trace, limit=spec.limit)
        return ListSource(trace_requests(records, block_size, model_id, spec.time_scale))
    if isinstance(spec, AgentXWorkload):
        return AgentXSource(spec, block_size, model_id)
    if isinstance(spec, AgentXTraceWorkload):
        return TraceReplaySource(read_conversations(spec.trace, spec.limit), spec, block_size, model_id)
    assert isinstance(spec, UniformWorkload)
    return UniformSource(spec, block_size, model_id)


def trace_workload(path: str | Path, current: AnyWorkload | None = None) -> MooncakeWorkload | AgentXTraceWorkload:
    """The workload of `--trace FILE`, told apart by content: Mooncake records replay open loop;
    conversations replay by the AgentX rules. A scenario that already replays conversations keeps
    every field but the file (warmup_first, start ratios, window, limit...: `--trace F` equals the
    scenario with `trace: F`); another kind lends its seed, lanes and duration when it has them."""
    if trace_format(path) == "mooncake":
        return MooncakeWorkload(kind="mooncake", trace=str(path))
    if isinstance(current, AgentXTraceWorkload):
        return current.model_copy(update={"trace": str(path)})
    keep = {}
    for name in ("seed", "concurrency", "duration_s", "max_context", "measure_start_s", "measure_s"):
        value = getattr(current, name, None)
        if value is not None:
            keep[name] = value
    keep.setdefault("concurrency", DEFAULT_TRACE_LANES)
    if "duration_s" in keep and keep.get("measure_start_s", 60.0) >= keep["duration_s"]:
        keep["measure_start_s"] = 0.0
    return AgentXTraceWorkload(kind="agentx-trace", trace=str(path), **keep)
