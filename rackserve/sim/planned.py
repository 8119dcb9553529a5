"""The planner in the simulator: the deployment's instances are built up front (the most the planner
may run); the planner activates, starts and drains them every tick (rackserve/planner). Inactive
instances are out of the router's view (LiveClusterView.set_healthy) and hold no GPUs; the report
gives SLA attainment, GPU-hours and a per-tick timeline (SimResult.planner)."""

from __future__ import annotations

import math
from typing import Any

from rackserve.planner import (
    Fleet,
    InstanceObs,
    InstanceSlot,
    PlannerSettings,
    Targets,
    TickObs,
    make_planner,
)
from rackserve.planner.fleet import ACTIVE, DRAINING, OFF, STARTING, gpu_seconds
from rackserve.planner.forecast import CostForecast, RoleShape
from rackserve.planner.policy import Bounds
from rackserve.planner.startup import startup_s
from rackserve.sim.events import Event, InstanceReady, PlannerTick
from rackserve.sim.metrics import Flight, is_warmup, pct


def _one_group(groups: list, role: str) -> Any:
    if len(groups) != 1:
        raise ValueError(f"planner: deployment.{role} must be one instance group (it has {len(groups)})")
    return groups[0]


class SimPlanner:
    def __init__(self, sim: Any, settings: PlannerSettings) -> None:
        dep = sim.scenario.config.deployment
        if dep.is_aggregated:
            raise ValueError("planner: aggregated deployments are not planned (prefill and decode roles only)")
        self.sim, self.s = sim, settings
        pg, dg = _one_group(dep.prefill, "prefill"), _one_group(dep.decode, "decode")
        self.bounds = self._bounds(pg, dg)
        slots = [InstanceSlot(i.name, "prefill", k, i.gpus) for k, i in enumerate(sim.prefill)]
        slots += [InstanceSlot(i.name, "decode", k, i.gpus) for k, i in enumerate(sim.decode)]
        self.fleet = Fleet(slots)
        self.startup = {role: startup_s(settings, sim.timing, insts[0].layout)
                        for role, insts in (("prefill", sim.prefill), ("decode", sim.decode))}
        self.policy = make_planner(settings.policy, settings, self.bounds, self._context(pg))
        start = Targets(settings.initial_prefill or self.bounds.max_prefill,
                        settings.initial_decode or self.bounds.max_decode)
        if not self.bounds.fits(start):
            raise ValueError(f"planner.initial_prefill / initial_decode: {start} is outside the bounds or budget")
        self.targets = start
        for role, n in (("prefill", start.prefill), ("decode", start.decode)):
            for slot in self.fleet.role(role)[:n]:
                self.fleet.activate_now(slot, 0.0)
        for slot in self.fleet.slots:
            if slot.state == OFF:
                sim._view.set_healthy(slot.name, False)
        self._tick_reset()
        self._next_decision = settings.tick_s
        self.timeline: dict[str, list] = {k: [] for k in (
            "t_s", "arrivals_per_s", "running_seqs", "prefill_active", "decode_active", "prefill_planned",
            "decode_planned", "gpus_held", "ttft_p90_s", "itl_p90_s")}
        self.ok_ttft = self.ok_itl = self.ok_both = self.finished = 0

    # ---- construction ---------------------------------------------------------------------------
    def _bounds(self, pg: Any, dg: Any) -> Bounds:
        s = self.s
        max_p = s.max_prefill or pg.count
        max_d = s.max_decode or dg.count
        for role, hi, built in (("prefill", max_p, pg.count), ("decode", max_d, dg.count)):
            if hi > built:
                raise ValueError(f"planner.max_{role}: {hi} is more than the {built} instances deployment.{role} builds")
        budget = s.gpu_budget or (pg.count * pg.gpus + dg.count * dg.gpus)
        b = Bounds(s.min_prefill, max_p, s.min_decode, max_d, pg.gpus, dg.gpus, budget)
        if not b.fits(Targets(b.min_prefill, b.min_decode)):
            raise ValueError("planner.gpu_budget: too small for min_prefill and min_decode instances")
        return b

    def _context(self, pg: Any) -> dict[str, Any]:
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
    def _tick_reset(self) -> None:
        self._samples = 0
        self._queued: dict[str, float] = {}  # per instance: sums over the tick's samples
        self._kv: dict[str, float] = {}
        self._arrivals = self._prompt = self._output = 0
        self._ttft: list[float] = []
        self._itl: list[float] = []

    def on_arrival(self, req: Any) -> None:
        self._arrivals += 1
        self._prompt += req.prompt_tokens
        self._output += req.output_tokens

    def on_finish(self, flight: Flight, now: float) -> None:
        req = flight.request
        ttft = flight.first_token - req.arrival_s
        itl = (now - flight.first_token) / (req.output_tokens - 1) if req.output_tokens > 1 else None
        self._ttft.append(ttft)
        if itl is not None:
            self._itl.append(itl)
        if is_warmup(req) or not self.sim.metrics.in_window(now):
            return
        self.finished += 1
        t_ok, i_ok = ttft <= self.s.ttft_target_s, itl is None or itl <= self.s.itl_target_s
        self.ok_ttft += t_ok
        self.ok_itl += i_ok
        self.ok_both += t_ok and i_ok

    # ---- events -----------------------------------------------------------------------------------
    def first_tick(self) -> Event:
        return PlannerTick(self.s.metric_pull_s)

    def on_instance_ready(self, now: float, slot: InstanceSlot) -> list[Event]:
        if self.fleet.ready(slot, now):
            self.sim._view.set_healthy(slot.name, True)
        return []

    def on_tick(self, now: float) -> list[Event]:
        """A metric pull (queues and KV use sampled); at each tick_s also a decision."""
        self._stop_drained(now)
        self._sample()
        if now < self._next_decision - 1e-9:
            return self._next(now, [])
        self._next_decision += self.s.tick_s
        obs = self._observe(now)
        self._record(obs)
        self.targets = self.policy.decide(obs, self.targets)
        out: list[Event] = []
        for change in self.fleet.apply(self.targets, now, lambda s: self.startup[s.role], self._load_of):
            slot = change.slot
            if change.to == STARTING:
                out.append(InstanceReady(slot.ready_at, slot))
            elif change.to == ACTIVE:  # a draining one asked back
                self.sim._view.set_healthy(slot.name, True)
            elif change.to == DRAINING:
                self.sim._view.set_healthy(slot.name, False)
        self._stop_drained(now)
        self._tick_reset()
        return self._next(now, out)

    def _next(self, now: float, out: list[Event]) -> list[Event]:
        if len(self.sim.queue) or out:  # else nothing else will happen: the run is over
            out.append(PlannerTick(min(now + self.s.metric_pull_s, self._next_decision)))
        return out

    def _sample(self) -> None:
        self._samples += 1
        for slot in self.fleet.slots:
            if slot.state != OFF:
                queued, kv = self._load_now(slot)
                self._queued[slot.name] = self._queued.get(slot.name, 0.0) + queued
                self._kv[slot.name] = self._kv.get(slot.name, 0.0) + kv

    def _load_now(self, slot: InstanceSlot) -> tuple[int, float]:
        """(queued prefill tokens, KV use) of the instance now."""
        ranks = self._ranks(slot)
        if slot.role == "prefill":
            return sum(r.queued_tokens for r in ranks), 0.0
        cap = self._kv_tokens(slot.index) * len(ranks)
        used = sum(r.active_decode_blocks for r in ranks) * self.sim.target_block_tokens
        return 0, min(1.0, used / cap) if cap else 0.0

    # ---- helpers ----------------------------------------------------------------------------------
    def _ranks(self, slot: InstanceSlot) -> list:
        inst = (self.sim.prefill if slot.role == "prefill" else self.sim.decode)[slot.index]
        return [self.sim._view.state((inst.name, r)) for r in range(len(inst.ranks))]

    def _load_of(self, slot: InstanceSlot) -> float:
        """Which active instance drains first: the least loaded (least to finish)."""
        ranks = self._ranks(slot)
        return sum(r.queued_work_s for r in ranks) + sum(r.running_seqs for r in ranks)

    def _empty(self, slot: InstanceSlot) -> bool:
        ranks = self._ranks(slot)
        if slot.role == "decode":  # routed requests not finished (in prefill, in transfer or decoding)
            return sum(r.running_seqs for r in ranks) == 0
        inst = self.sim.prefill[slot.index]
        return not inst.busy and sum(r.active_decode_blocks for r in ranks) == 0

    def _stop_drained(self, now: float) -> None:
        for slot in self.fleet.slots:
            if slot.state == DRAINING and self._empty(slot):
                self.fleet.drained(slot, now)

    def _observe(self, now: float) -> TickObs:
        insts = []
        n = max(self._samples, 1)
        for slot in self.fleet.slots:
            if slot.state == OFF:
                continue
            ranks = self._ranks(slot)
            prefill = slot.role == "prefill"
            insts.append(InstanceObs(
                slot.name, slot.role, slot.state, slot.gpus,
                queued_prefill_tokens=round(self._queued.get(slot.name, 0.0) / n),
                queued_prefill_s=sum(r.queued_work_s for r in ranks) if prefill else 0.0,
                running_seqs=0 if prefill else sum(r.running_seqs for r in ranks),
                kv_used=self._kv.get(slot.name, 0.0) / n))
        n = max(self._arrivals, 1)
        return TickObs(now, self.s.tick_s, self._arrivals, self._prompt / n, self._output / n,
                       tuple(self._ttft), tuple(self._itl), tuple(insts))

    def _record(self, obs: TickObs) -> None:
        tl = self.timeline
        tl["t_s"].append(obs.now_s)
        tl["arrivals_per_s"].append(obs.arrival_rate)
        tl["running_seqs"].append(sum(i.running_seqs for i in obs.instances))
        tl["prefill_active"].append(len(obs.of("prefill", ACTIVE)))
        tl["decode_active"].append(len(obs.of("decode", ACTIVE)))
        tl["prefill_planned"].append(self.fleet.planned("prefill"))
        tl["decode_planned"].append(self.fleet.planned("decode"))
        tl["gpus_held"].append(self.fleet.held_gpus())
        tl["ttft_p90_s"].append(pct(list(obs.ttft_s), 90))
        tl["itl_p90_s"].append(pct(list(obs.itl_s), 90))

    def report(self, window_start: float, window_end: float) -> dict:
        """SimResult.planner: attainment over the measured requests, GPU-hours over the window."""
        seconds = gpu_seconds(self.fleet.held, window_start, window_end)
        done = self.finished
        share = (lambda k: k / done) if done else (lambda k: math.nan)
        return {
            "policy": self.s.policy, "tick_s": self.s.tick_s, "ttft_target_s": self.s.ttft_target_s,
            "itl_target_s": self.s.itl_target_s, "gpu_budget": self.bounds.gpu_budget,
            "startup_s": dict(self.startup), "requests": done,
            "sla_attainment": share(self.ok_both), "ttft_attainment": share(self.ok_ttft),
            "itl_attainment": share(self.ok_itl), "gpu_hours": seconds / 3600.0,
            "mean_gpus": seconds / (window_end - window_start) if window_end > window_start else math.nan,
            "gpus_held": [list(x) for x in self.fleet.held], "timeline": self.timeline,
        }
