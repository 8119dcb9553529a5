"""Turn a validated workload spec into an ArrivalSource."""

from __future__ import annotations

from rackserve.workload.agentx import AgentXSource
from rackserve.workload.mooncake import read_trace, trace_requests
from rackserve.workload.source import ArrivalSource, ListSource
from rackserve.workload.spec import AgentXWorkload, MooncakeWorkload, UniformWorkload
from rackserve.workload.uniform import UniformSource


def build_source(
    spec: MooncakeWorkload | AgentXWorkload | UniformWorkload, block_size: int, model_id: str
) -> ArrivalSource:
    if isinstance(spec, MooncakeWorkload):
        records = read_trace(spec.trace, limit=spec.limit)
        return ListSource(trace_requests(records, block_size, model_id, spec.time_scale))
    if isinstance(spec, AgentXWorkload):
        return AgentXSource(spec, block_size, model_id)
    return UniformSource(spec, block_size, model_id)
