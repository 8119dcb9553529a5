"""Drive the simulator from a scenario: one run per policy on the same arrivals (same seed)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rackserve.sim.aggregated import AggregatedSimulator
from rackserve.sim.metrics import SimResult
from rackserve.sim.progress import Progress
from rackserve.sim.scenario import Scenario
from rackserve.sim.simulator import Simulator
from rackserve.sim.sizing import prefill_chunk_tokens
from rackserve.sim.step_cache import CachedTiming
from rackserve.sim.step_store import fingerprint, from_env
from rackserve.timing.timing_model import TimingModel
from rackserve.workload.build import build_source, trace_workload
from rackserve.workload.mooncake import read_trace, trace_requests
from rackserve.workload.request import Request
from rackserve.workload.source import ArrivalSource, ListSource
from rackserve.workload.spec import (
    AgentXTraceWorkload,
    AgentXWorkload,
    MooncakeWorkload,
    UniformWorkload,
)


def with_trace(scenario: Scenario, trace: str | Path) -> Scenario:
    """`--trace FILE` (.jsonl or .jsonl.gz): Mooncake records or recorded conversations, by content."""
    return scenario.with_workload(trace_workload(trace, scenario.workload))


def with_concurrency(scenario: Scenario, concurrency: int) -> Scenario:
    """The same closed-loop workload at another concurrency (sweeps)."""
    wl = scenario.workload
    if not isinstance(wl, AgentXWorkload | AgentXTraceWorkload | UniformWorkload):
        raise ValueError(f"concurrency: workload kind {wl.kind!r} is open loop (a trace)")
    return scenario.with_workload(wl.model_copy(update={"concurrency": concurrency}))


def timing_for(scenario: Scenario) -> CachedTiming:
    """The scenario's cost model; the router's reference prefill step is its engine chunk."""
    return CachedTiming(TimingModel.from_section(scenario.config.timing, prefill_chunk_tokens(scenario.sim)))


_TIMINGS: dict[tuple[str, int], CachedTiming] = {}  # per process: the step-cost memo of each timing
SHARED_TIMINGS = 8  # timing models kept (a frontier search's worker sees a few: MTP on and off, two chunks)


def shared_timing(scenario: Scenario) -> CachedTiming:
    """One CachedTiming per (timing section, prefill chunk) in this process, so the points of a
    sweep, or the replays of a frontier search that land on one worker, share its memo: a key
    always prices the same representative batch, so sharing changes no figure, only speed. The
    chunk is part of the key: it is the router's reference step (timing_for). With a step store
    ($RACKSERVE_STEP_STORE), the memo also takes what was stored since it last looked."""
    key = (scenario.config.timing.model_dump_json(), prefill_chunk_tokens(scenario.sim))
    timing = _TIMINGS.get(key)
    if timing is None:
        if len(_TIMINGS) >= SHARED_TIMINGS:
            _TIMINGS.pop(next(iter(_TIMINGS)))  # the oldest: its memo and router tables go with it
        timing = _TIMINGS[key] = timing_for(scenario)
    store = from_env()
    if store is not None:  # what this or another process (a search's other workers) stored since
        store.refresh(timing, store_key(scenario, timing))
    return timing


def store_key(scenario: Scenario, timing: CachedTiming) -> str:
    """The step store's file for this scenario's cost model (rackserve/sim/step_store.py)."""
    return fingerprint(scenario.config.timing.model_dump_json(), prefill_chunk_tokens(scenario.sim),
                       timing.grid_params())


def keep_steps(scenario: Scenario, timing: CachedTiming) -> None:
    """Write what `timing` priced since it was loaded or last kept to the step store, where one is
    configured ($RACKSERVE_STEP_STORE); nothing when it priced nothing new."""
    store = from_env()
    if store is None or timing.size() == timing.stored_size:
        return
    store.save(timing, store_key(scenario, timing))


def source_factory(scenario: Scenario) -> Callable[[], ArrivalSource]:
    """Fresh sources with identical arrivals: a trace is read and hashed once and shared."""
    cfg = scenario.config
    block, model = cfg.timing.target_block_tokens, cfg.engine.model_id
    wl = scenario.workload
    if isinstance(wl, MooncakeWorkload):
        requests: list[Request] = trace_requests(read_trace(wl.trace, wl.limit), block, model, wl.time_scale)
        return lambda: ListSource(requests)
    return lambda: build_source(wl, block, model)


def simulator_for(scenario: Scenario) -> type:
    """The event loop of the scenario's deployment: aggregated instances (rackserve/sim/aggregated.py)
    or prefill and decode instances (rackserve/sim/simulator.py)."""
    return AggregatedSimulator if scenario.config.deployment.is_aggregated else Simulator


def simulate(scenario: Scenario, arrivals: Sequence[Request] | ArrivalSource | None = None,
             policy: str | None = None, timing: Any | None = None) -> SimResult:
    """One run: `arrivals` (a request list, e.g. the live cluster's, or a source) or the scenario's
    own workload; `policy` defaults to the scenario's routing policy."""
    if arrivals is None:
        source = source_factory(scenario)()
    elif isinstance(arrivals, Sequence):
        source = ListSource(list(arrivals))
    else:
        source = arrivals
    timing = timing if timing is not None else timing_for(scenario)
    return simulator_for(scenario)(scenario, timing, policy or scenario.config.routing.policy, source).run()


def run_policies(scenario: Scenario, policies: Sequence[str], timing: Any | None = None,
                 progress: Callable[[str], Progress | None] | None = None) -> list[SimResult]:
    """Simulate `scenario` once per policy on the same arrivals; `progress(policy)` may give a callback."""
    timing = timing if timing is not None else timing_for(scenario)
    make_source = source_factory(scenario)
    results = []
    for policy in policies:
        cb = progress(policy) if progress is not None else None
        results.append(simulator_for(scenario)(scenario, timing, policy, make_source(), cb).run())
    return results
