"""The planner in the live cluster (issue 52): the router runs the same PlannerRun as the simulator
(rackserve/planner/controller.py) on its own clock, reading the load it books on every rank (the
metric pull), the front door's arrivals and finished requests (TTFT / ITL), and carries the
decisions out:

- start: the worker service spawns the instance's rank actors at once (Scale run); the instance
  becomes routable when both its actors answer and the modelled start-up delay (weights load +
  warm-up, rackserve/planner/startup.py) is over, so a twin's scale-up costs what the real one would;
- drain: out of routing at once; its running requests finish; once the router books nothing on it,
  the worker stops its actors (Scale not run; refused while it still holds requests, then retried);
- every metric pull the workers' running sets are reconciled with the fleet (a worker restarted by
  the supervisor comes back with its initial instances; the planner starts or stops the rest).

The clock is simulated seconds: wall seconds since the planner started / cluster.time_scale (wall
seconds when unpaced), the unit of the TTFT / ITL the front door measures and of every planner
setting. `/admin/planner` shows the fleet, the decisions and the SLA so far."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import grpc

from rackserve.config import Config
from rackserve.planner.controller import Deployment, PlannerRun, bounds_of
from rackserve.planner.fleet import ACTIVE, DRAINING, OFF, STARTING, InstanceSlot
from rackserve.planner.forecast import CostForecast, RoleShape
from rackserve.planner.startup import startup_s
from services.topology import InstanceSpec, instances

log = logging.getLogger(__name__)
SCALE_TIMEOUT_S = 120.0  # a start places and readies every rank actor of the instance
REASON = "planner"  # the router's out-of-routing reason for an instance not active


def _layout(timing: Any, spec: InstanceSpec) -> Any:
    return timing.layout(spec.layout, spec.gpus if spec.layout == "wide-ep" else None)


class LivePlanner:
    def __init__(self, cfg: Config, orchestrator: Any, timing: Any, metrics: Any) -> None:
        s = cfg.planner
        if s is None:
            raise ValueError("planner: the config has no planner section")
        self.s, self.orch, self.core, self.metrics = s, orchestrator, orchestrator.router, metrics
        specs = {role: instances(cfg, role) for role in ("prefill", "decode")}
        for role, groups in (("prefill", cfg.deployment.prefill), ("decode", cfg.deployment.decode)):
            if len(groups) != 1:
                raise ValueError(f"planner: deployment.{role} must be one instance group (it has {len(groups)})")
        p0, d0 = specs["prefill"][0], specs["decode"][0]
        bounds = bounds_of(s, (len(specs["prefill"]), p0.gpus), (len(specs["decode"]), d0.gpus))
        slots = [InstanceSlot(spec.name, role, k, spec.gpus) for role in ("prefill", "decode")
                 for k, spec in enumerate(specs[role])]
        e = cfg.engine
        kv_tokens = e.cache_blocks_per_rank * e.block_size
        prefill = RoleShape(p0.layout, _layout(timing, p0), p0.dp_ranks, p0.gpus, chunk_tokens=e.max_num_batched_tokens)
        decode = RoleShape(d0.layout, _layout(timing, d0), d0.dp_ranks, d0.gpus, e.max_num_seqs, kv_tokens)
        context = {"prefill_step_tokens": e.max_num_batched_tokens * p0.dp_ranks,
                   "forecast": CostForecast(timing, prefill, decode, s.headroom)}
        startup = {"prefill": startup_s(s, timing, prefill.layout), "decode": startup_s(s, timing, decode.layout)}
        deployment = Deployment(self._ranks, lambda slot: kv_tokens, e.block_size, self._empty)
        self.run = PlannerRun(s, slots, bounds, context, startup, deployment)
        self.scale = cfg.cluster.time_scale or 1.0  # wall s per planner s
        self._t0 = time.monotonic()
        for slot in self.run.activate_initial(0.0):  # the workers start the same ones (running_at_start)
            self._route(slot, False)
        self.running: dict[str, bool] = {slot.name: slot.state != OFF for slot in self.run.fleet.slots}
        self._scaling: dict[str, asyncio.Task] = {}
        self.errors: list[str] = []  # the last Scale failures (/admin/planner)
        self._export()

    # ---- the clock and what the front door tells it ---------------------------------------------------
    def now(self) -> float:
        return (time.monotonic() - self._t0) / self.scale

    def on_arrival(self, prompt_tokens: int, max_tokens: int) -> None:
        self.run.on_arrival(prompt_tokens, max_tokens)

    def on_finish(self, ttft_s: float, tpot_s: float | None) -> None:
        """A request finished (simulated seconds, as the front door measures them)."""
        self.run.on_finish(ttft_s, tpot_s)
        met = ttft_s <= self.s.ttft_target_s and (tpot_s is None or tpot_s <= self.s.itl_target_s)
        self.metrics.planner.sla_requests.labels(met=str(met).lower()).inc()

    # ---- the loop ------------------------------------------------------------------------------------
    async def loop(self) -> None:
        """Forever: a metric pull every metric_pull_s, a decision every tick_s (planner seconds)."""
        next_decision = self.s.tick_s
        while True:
            await asyncio.sleep(self.s.metric_pull_s * self.scale)
            now = self.now()
            self._ready(now)
            self.run.drained(now)
            self.run.sample()
            if now >= next_decision:
                next_decision += self.s.tick_s
                for change in self.run.decide(now):
                    self.metrics.planner.changes.labels(role=change.slot.role, to=change.to).inc()
                    self._route(change.slot, change.to == ACTIVE)
                self.metrics.planner.decisions.labels(policy=self.s.policy).inc()
                self.run.drained(now)
            self._reconcile()
            self._export()

    def _ready(self, now: float) -> None:
        """Starting instances whose actors are up and whose start-up delay is over: routable."""
        for slot in self.run.fleet.role("prefill", STARTING) + self.run.fleet.role("decode", STARTING):
            if self.running[slot.name] and slot.name not in self._scaling and self.run.fleet.ready(slot, now):
                self._route(slot, True)

    def _reconcile(self) -> None:
        """Ask the workers to run what the fleet holds (starting, active, draining) and stop the rest."""
        for slot in self.run.fleet.slots:
            want = slot.state != OFF
            if want != self.running[slot.name] and slot.name not in self._scaling:
                self._scaling[slot.name] = asyncio.create_task(self._scale(slot, want))

    async def _scale(self, slot: InstanceSlot, run: bool) -> None:
        try:
            reply = await self.orch.scale(slot.role, slot.name, run, SCALE_TIMEOUT_S)
            self.running[slot.name] = reply.running
            log.info("planner: %s %s in %.1f s", slot.name, "started" if run else "stopped", reply.took_s)
        except grpc.aio.AioRpcError as exc:  # still holds requests, or its worker is restarting: next pull
            self.errors = [*self.errors[-9:], f"{slot.name}: {exc.code().name}: {exc.details()}"]
        finally:
            self._scaling.pop(slot.name, None)

    def _route(self, slot: InstanceSlot, routable: bool) -> None:
        for rank in self.core.ranks_of(slot.name):
            self.core.mark_health(slot.name, rank, routable, reason=REASON)

    # ---- what it reads of the router -------------------------------------------------------------------
    def _ranks(self, slot: InstanceSlot) -> list:
        return self.core.rank_states(slot.name)

    def _empty(self, slot: InstanceSlot) -> bool:
        """Nothing routed to it is unfinished (the router books a request on its prefill rank until
        the prefill answers and on its decode rank until the stream ends)."""
        return sum(r.running_seqs for r in self._ranks(slot)) == 0

    # ---- what it shows ------------------------------------------------------------------------------------
    def _export(self) -> None:
        m, fleet = self.metrics.planner, self.run.fleet
        for role in ("prefill", "decode"):
            m.instances.labels(role=role, state="planned").set(fleet.planned(role))
            m.instances.labels(role=role, state="running").set(
                sum(self.running[s.name] for s in fleet.role(role)))
            for state in (STARTING, ACTIVE, DRAINING):
                m.instances.labels(role=role, state=state).set(len(fleet.role(role, state)))
        m.gpus_held.set(fleet.held_gpus())

    def state(self) -> dict:
        """/admin/planner: the policy, targets, every instance, the decisions and the SLA so far."""
        now = self.now()
        fleet = self.run.fleet
        return {
            "policy": self.s.policy, "now_s": now, "time_scale": self.scale,
            "targets": {"prefill": self.run.targets.prefill, "decode": self.run.targets.decode},
            "instances": [
                {"name": s.name, "role": s.role, "state": s.state, "gpus": s.gpus, "running": self.running[s.name],
                 "ready_at_s": s.ready_at if s.state == STARTING else None} for s in fleet.slots],
            "planned": {role: fleet.planned(role) for role in ("prefill", "decode")},
            "decisions": self.run.decisions[-100:],
            "report": self.run.report(0.0, now),
            "errors": self.errors,
        }
