"""The planner in the simulator: the deployment's instances are built up front (the most the planner
may run); the planner activates, starts and drains them every tick (rackserve/planner). Inactive
instances are out of the router's view (LiveClusterView.set_healthy) and hold no GPUs; the report
gives SLA attainment, GPU-hours and a per-tick timeline (SimResult.planner)."""

from __future__ import annotations

from typing import Any

from rackserve.planner import InstanceSlot, PlannerSettings, Targets
from rackserve.planner.controller import Deployment, PlannerRun, bounds_of
from rackserve.planner.fleet import ACTIVE, DRAINING, STARTING
from rackserve.planner.forecast import CostForecast, RoleShape
from rackserve.planner.policy import Bounds
from rackserve.planner.startup import startup_s
from rackserve.sim.events import Event, InstanceReady, PlannerTick
from rackserve.sim.metrics import Flight, is_warmup


def _one_group(groups: list, role: str) -> Any:
    if len(groups) != 1:
        raise ValueError(f"planner: deployment.{role} must be one instance group (it has {len(groups)})")
    return groups[0]


class SimPlanner:
    """The simulator's clock around a PlannerRun: metric pulls and decisions as PlannerTick events,
    start-ups as InstanceReady events, routing health through the simulator's view."""

    def __init__(self, sim: Any, settings: PlannerSettings) -> None:
        dep = sim.scenario.config.deployment
        if dep.is_aggregated:
            raise ValueError("planner: aggregated deployments are not planned (prefill and decode roles only)")
        self.sim, self.s = sim, settings
        pg, dg = _one_group(dep.prefill, "prefill"), _one_group(dep.decode, "decode")
        bounds = bounds_of(settings, (pg.count, pg.gpus), (dg.count, dg.gpus))
        slots = [InstanceSlot(i.name, "prefill", k, i.gpus) for k, i in enumerate(sim.prefill)]
        slots += [InstanceSlot(i.name, "decode", k, i.gpus) for k, i in enumerate(sim.decode)]
        startup = {role: startup_s(settings, sim.timing, insts[0].layout)
                   for role, insts in (("prefill", sim.prefill), ("decode", sim.decode))}
        deployment = Deployment(self._ranks, lambda slot: self._kv_tokens(slot.index), sim.target_block_tokens,
                                self._empty)
        self.run = PlannerRun(settings, slots, bounds, self._context(pg, bounds), startup, deployment)
        self.fleet, self.bounds, self.startup = self.run.fleet, bounds, startup
        for slot in self.run.activate_initial(0.0):
            sim._view.set_healthy(slot.name, False)
        self._next_decision = settings.tick_s

    @property
    def targets(self) -> Targets:
        return self.run.targets

    @property
    def policy(self) -> Any:
        return self.run.policy

    @policy.setter
    def policy(self, policy: Any) -> None:  # a test's scripted policy
        self.run.policy = policy

    @property
    def timeline(self) -> dict[str, list]:
        return self.run.timeline

    def _context(self, pg: Any, bounds: Bounds) -> dict[str, Any]:
        sim = self.sim
        p, d = sim.prefill[0], sim.decode[0]
        sz = sim.sizing
        prefill = RoleShape(p.layout_name, p.layout, len(p.ranks), p.gpus, chunk_tokens=sz.prefill_chunk_tokens)
        decode = RoleShape(d.layout_name, d.layout, len(d.ranks), d.gpus, sz.decode_max_seqs[0], self._kv_tokens(0))
        return {"prefill_step_tokens": sz.prefill_chunk_tokens * pg.dp_ranks,
                "forecast": CostForecast(sim.timing, prefill, decode, self.s.headroom)}

    def _kv_tokens(self, idx: int) -> int:
        sim = self.sim
        override = sim._decode_kv_override(sim._decode_group(idx))
        return override if override is not None else sim.sizing.decode_kv_tokens[sim._decode_group(idx)]

    # ---- what the simulator tells it ------------------------------------------------------------
    def on_arrival(self, req: Any) -> None:
        self.run.on_arrival(req.prompt_tokens, req.output_tokens)

    def on_finish(self, flight: Flight, now: float) -> None:
        req = flight.request
        ttft = flight.first_token - req.arrival_s
        itl = (now - flight.first_token) / (req.output_tokens - 1) if req.output_tokens > 1 else None
        self.run.on_finish(ttft, itl, counted=not is_warmup(req) and self.sim.metrics.in_window(now))

    # ---- events -----------------------------------------------------------------------------------
    def first_tick(self) -> Event:
        return PlannerTick(self.s.metric_pull_s)

    def on_instance_ready(self, now: float, slot: InstanceSlot) -> list[Event]:
        if self.fleet.ready(slot, now):
            self.sim._view.set_healthy(slot.name, True)
        return []

    def on_tick(self, now: float) -> list[Event]:
        """A metric pull (queues and KV use sampled); at each tick_s also a decision."""
        self.run.drained(now)
        self.run.sample()
        if now < self._next_decision - 1e-9:
            return self._next(now, [])
        self._next_decision += self.s.tick_s
        out: list[Event] = []
        for change in self.run.decide(now):
            slot = change.slot
            if change.to == STARTING:
                out.append(InstanceReady(slot.ready_at, slot))
            elif change.to == ACTIVE:  # a draining one asked back
                self.sim._view.set_healthy(slot.name, True)
            elif change.to == DRAINING:
                self.sim._view.set_healthy(slot.name, False)
        self.run.drained(now)
        return self._next(now, out)

    def _next(self, now: float, out: list[Event]) -> list[Event]:
        if len(self.sim.queue) or out:  # else nothing else will happen: the run is over
            out.append(PlannerTick(min(now + self.s.metric_pull_s, self._next_decision)))
        return out

    # ---- helpers ----------------------------------------------------------------------------------
    def _ranks(self, slot: InstanceSlot) -> list:
        inst = (self.sim.prefill if slot.role == "prefill" else self.sim.decode)[slot.index]
        return [self.sim._view.state((inst.name, r)) for r in range(len(inst.ranks))]

    def _empty(self, slot: InstanceSlot) -> bool:
        ranks = self._ranks(slot)
        if slot.role == "decode":  # routed requests not finished (in prefill, in transfer or decoding)
            return sum(r.running_seqs for r in ranks) == 0
        inst = self.sim.prefill[slot.index]
        return not inst.busy and sum(r.active_decode_blocks for r in ranks) == 0

    def report(self, window_start: float, window_end: float) -> dict:
        """SimResult.planner: attainment over the measured requests, GPU-hours over the window."""
        return self.run.report(window_start, window_end)
