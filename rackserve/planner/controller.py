"""One planner run, whichever clock drives it: the simulator (rackserve/sim/planned.py) and the live
router (services/router/planner_loop.py) both hold a `PlannerRun` and tell it what happened; it keeps
the fleet, samples the instances' load every metric pull, builds the tick's observations, asks the
policy, moves the fleet, and books SLA attainment, GPU-hours and the per-tick timeline.

What differs between the clocks is given to it as a `Deployment` (how to read an instance's ranks,
its KV capacity, whether a draining one is empty); the actions on the world (take an instance out of
routing, start its ranks, stop them) are the caller's, from the `Change`s `decide` returns."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rackserve.planner.fleet import ACTIVE, DRAINING, OFF, Change, Fleet, InstanceSlot, gpu_seconds
from rackserve.planner.observation import InstanceObs, Targets, TickObs
from rackserve.planner.policies import make_planner
from rackserve.planner.policy import Bounds

TIMELINE = ("t_s", "arrivals_per_s", "running_seqs", "prefill_active", "decode_active", "prefill_planned",
            "decode_planned", "gpus_held", "ttft_p90_s", "itl_p90_s")


def percentile(values: list[float], q: float) -> float:
    """numpy's percentile (as the simulator's metrics read them); NaN without values."""
    return float(np.percentile(values, q)) if values else math.nan


@dataclass(frozen=True)
class Deployment:
    """What the run reads of the deployment it steers (either clock)."""

    ranks: Callable[[InstanceSlot], list[Any]]  # the instance's RankStates (routing's view)
    kv_tokens: Callable[[InstanceSlot], int]  # decode: KV tokens one rank holds
    block_tokens: int  # tokens per KV block of RankState.active_decode_blocks
    empty: Callable[[InstanceSlot], bool]  # a draining instance has nothing left to finish


def bounds_of(settings: Any, prefill: tuple[int, int], decode: tuple[int, int]) -> Bounds:
    """The decisions' bounds from planner settings and each role's (instances built, GPUs each)."""
    s = settings
    max_p = s.max_prefill or prefill[0]
    max_d = s.max_decode or decode[0]
    for role, hi, built in (("prefill", max_p, prefill[0]), ("decode", max_d, decode[0])):
        if hi > built:
            raise ValueError(f"planner.max_{role}: {hi} is more than the {built} instances deployment.{role} builds")
    budget = s.gpu_budget or (prefill[0] * prefill[1] + decode[0] * decode[1])
    b = Bounds(s.min_prefill, max_p, s.min_decode, max_d, prefill[1], decode[1], budget)
    if not b.fits(Targets(b.min_prefill, b.min_decode)):
        raise ValueError("planner.gpu_budget: too small for min_prefill and min_decode instances")
    return b


def initial_targets(settings: Any, bounds: Bounds) -> Targets:
    start = Targets(settings.initial_prefill or bounds.max_prefill, settings.initial_decode or bounds.max_decode)
    if not bounds.fits(start):
        raise ValueError(f"planner.initial_prefill / initial_decode: {start} is outside the bounds or budget")
    return start


class PlannerRun:
    def __init__(self, settings: Any, slots: list[InstanceSlot], bounds: Bounds, context: dict[str, Any],
                 startup: dict[str, float], deployment: Deployment) -> None:
        self.s, self.bounds, self.startup, self.dep = settings, bounds, startup, deployment
        self.fleet = Fleet(slots)
        self.policy = make_planner(settings.policy, settings, bounds, context)
        self.targets = initial_targets(settings, bounds)
        self.timeline: dict[str, list] = {k: [] for k in TIMELINE}
        # every tick's targets and changes [instance, new state, its running requests then] (/admin/planner)
        self.decisions: list[dict] = []
        self.ok_ttft = self.ok_itl = self.ok_both = self.finished = 0
        self._tick_reset()

    def activate_initial(self, now: float) -> list[InstanceSlot]:
        """The first initial_* instances of each role active at `now` (no start-up); the slots left off."""
        for role, n in (("prefill", self.targets.prefill), ("decode", self.targets.decode)):
            for slot in self.fleet.role(role)[:n]:
                self.fleet.activate_now(slot, now)
        return [s for s in self.fleet.slots if s.state == OFF]

    # ---- what happened -----------------------------------------------------------------------------
    def _tick_reset(self) -> None:
        self._samples = 0
        self._queued: dict[str, float] = {}  # per instance: sums over the tick's samples
        self._kv: dict[str, float] = {}
        self._arrivals = self._prompt = self._output = 0
        self._ttft: list[float] = []
        self._itl: list[float] = []

    def on_arrival(self, prompt_tokens: int, output_tokens: int) -> None:
        self._arrivals += 1
        self._prompt += prompt_tokens
        self._output += output_tokens

    def on_finish(self, ttft_s: float, itl_s: float | None, counted: bool = True) -> None:
        """A request finished: its TTFT and ITL (None: one output token) feed the next decision;
        `counted` (in the measured window, not warm-up) books it in the attainment."""
        self._ttft.append(ttft_s)
        if itl_s is not None:
            self._itl.append(itl_s)
        if not counted:
            return
        self.finished += 1
        t_ok, i_ok = ttft_s <= self.s.ttft_target_s, itl_s is None or itl_s <= self.s.itl_target_s
        self.ok_ttft += t_ok
        self.ok_itl += i_ok
        self.ok_both += t_ok and i_ok

    def sample(self) -> None:
        """A metric pull: every instance holding GPUs, its queued prefill tokens and KV use now."""
        self._samples += 1
        for slot in self.fleet.slots:
            if slot.state != OFF:
                queued, kv = self._load_now(slot)
                self._queued[slot.name] = self._queued.get(slot.name, 0.0) + queued
                self._kv[slot.name] = self._kv.get(slot.name, 0.0) + kv

    def _load_now(self, slot: InstanceSlot) -> tuple[int, float]:
        ranks = self.dep.ranks(slot)
        if slot.role == "prefill":
            return sum(r.queued_tokens for r in ranks), 0.0
        cap = self.dep.kv_tokens(slot) * len(ranks)
        used = sum(r.active_decode_blocks for r in ranks) * self.dep.block_tokens
        return 0, min(1.0, used / cap) if cap else 0.0

    # ---- decisions ---------------------------------------------------------------------------------
    def decide(self, now: float) -> list[Change]:
        """A tick: observe, ask the policy, move the fleet; the changes for the caller to carry out
        (STARTING slots carry their ready_at; ACTIVE ones were draining and are back; DRAINING ones
        leave routing)."""
        obs = self.observe(now)
        self._record(obs)
        before = self.targets
        self.targets = self.policy.decide(obs, self.targets)
        changes = self.fleet.apply(self.targets, now, lambda s: self.startup[s.role], self._load_of)
        self.decisions.append({
            "t_s": now, "before": [before.prefill, before.decode], "targets": [self.targets.prefill, self.targets.decode],
            "arrivals_per_s": obs.arrival_rate, "changes": [[c.slot.name, c.to, self._running(c.slot)] for c in changes]})
        self._tick_reset()
        return changes

    def drained(self, now: float) -> list[InstanceSlot]:
        """Draining instances with nothing left: off now (their GPUs free); the caller stops them."""
        out = []
        for slot in self.fleet.slots:
            if slot.state == DRAINING and self.dep.empty(slot):
                self.fleet.drained(slot, now)
                out.append(slot)
        return out

    def _running(self, slot: InstanceSlot) -> int:
        """Requests routed to the instance and not finished with it (a drain lets them finish)."""
        return sum(r.running_seqs for r in self.dep.ranks(slot))

    def _load_of(self, slot: InstanceSlot) -> float:
        """Which active instance drains first: the least loaded (least to finish)."""
        ranks = self.dep.ranks(slot)
        return sum(r.queued_work_s for r in ranks) + sum(r.running_seqs for r in ranks)

    def observe(self, now: float) -> TickObs:
        insts = []
        n = max(self._samples, 1)
        for slot in self.fleet.slots:
            if slot.state == OFF:
                continue
            ranks = self.dep.ranks(slot)
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
        tl["ttft_p90_s"].append(percentile(list(obs.ttft_s), 90))
        tl["itl_p90_s"].append(percentile(list(obs.itl_s), 90))

    # ---- the report --------------------------------------------------------------------------------
    def report(self, window_start: float, window_end: float) -> dict:
        """Attainment over the counted requests, GPU-hours over the window, the timeline."""
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
