"""The discrete-event simulator: arrivals -> router -> DEP prefill ranks -> P/D transfer -> decode.

Drive it with a Scenario, a timing model, a policy name and an ArrivalSource (a trace list or a
closed-loop session generator): `Simulator(...).run()` returns a SimResult. Decode instances leap
over identical steps until the next event, so cost grows with events, not output tokens.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable
from typing import Any

from rackserve.routing.index import PrefixIndex
from rackserve.routing.match import PrefixMatch
from rackserve.routing.policy import make_policy
from rackserve.routing.regret import regret_s
from rackserve.routing.router import Router, policy_settings
from rackserve.routing.timing_cost import TimingCost
from rackserve.routing.view import RankState, RequestView
from rackserve.sched.decode_batch import DecodeClock
from rackserve.sched.limits import SchedulerLimits
from rackserve.sched.scheduler import RankScheduler
from rackserve.sched.seq_state import SeqState
from rackserve.sim.block_keys import BlockKeys
from rackserve.sim.decode_side import DecodeSide
from rackserve.sim.events import (
    Arrival,
    Event,
    EventQueue,
    KVArrive,
    PrefillKick,
    PrefillStepEnd,
)
from rackserve.sim.gc_policy import rare_full_collections
from rackserve.sim.instances import Instance, Leap
from rackserve.sim.kv import ClusterKV, pool_limits
from rackserve.sim.live_view import LiveClusterView
from rackserve.sim.metrics import Flight, MetricsCollector, SimResult
from rackserve.sim.planned import SimPlanner
from rackserve.sim.pool_paths import PoolPaths
from rackserve.sim.pool_scope import scoped_pools
from rackserve.sim.progress import TICK_EVERY, Progress, ProgressTick
from rackserve.sim.rank_idle import RankIdleWatch
from rackserve.sim.result import build_result
from rackserve.sim.scenario import Scenario
from rackserve.sim.sizing import size_scenario
from rackserve.timing.batch import StepBatch, StepCost
from rackserve.workload.request import Request
from rackserve.workload.source import ArrivalSource, ListSource

_COSTS: weakref.WeakKeyDictionary[Any, dict[frozenset, TimingCost]] = weakref.WeakKeyDictionary()


SIZED_LAYOUTS = ("wide-ep", "dep", "tep")  # layouts whose size is the group's GPU count


def make_layout(timing: Any, layout: str, gpus: int, moe_tp: int = 1) -> Any:
    if layout not in SIZED_LAYOUTS:
        return timing.layout(layout)
    if moe_tp == 1:
        return timing.layout(layout, ranks=gpus)
    return timing.layout(layout, ranks=gpus, moe_tp=moe_tp)


def router_cost(timing: Any, scenario: Scenario) -> TimingCost:
    """The router's tabulated cost (rackserve.routing.TimingCost) for the scenario's layouts, shared
    by every Simulator on the same timing model and layouts (tables take ~0.5 s per layout)."""
    groups = [*scenario.config.deployment.decode, *scenario.config.deployment.prefill]
    layouts = {g.layout: make_layout(timing, g.layout, g.gpus, g.moe_tp) for g in groups}
    per_timing = _COSTS.setdefault(timing, {})
    key = frozenset(layouts.items())
    if key not in per_timing:
        per_timing[key] = TimingCost(timing, layouts)
    return per_timing[key]


def _wait_for_fetches(cost: StepCost, now: float, ready: float) -> StepCost:
    """A step that includes a prompt whose pooled KV is still crossing starts computing when it has
    arrived at `ready` (a KV connector's load completes before the prompt's compute: vLLM schedules
    a request waiting for remote KV only once it is loaded); the wait is the step's "kv_transfer".
    A prompt whose KV was prefetched while it queued (pool.prefetch_while_queued) waits for nothing."""
    wait = ready - now
    if wait <= 0:
        return cost
    busy = tuple(b + wait for b in cost.rank_busy_s)
    return StepCost(cost.total_s + wait, {**cost.breakdown, "kv_transfer": cost.breakdown.get("kv_transfer", 0.0) + wait},
                    busy, cost.bound)


def measured_window(scenario: Scenario) -> tuple[float, float | None]:
    """(start, end) of the measured window: the workload's own (agentx-trace: measure_start_s,
    measure_s) or else the scenario's sim.measure_start_s / measure_duration_s (end None: no end)."""
    window = getattr(scenario.workload, "measure_window", None)
    if window is not None:
        return float(window[0]), float(window[1])
    sim = scenario.sim
    return sim.measure_start_s, (None if sim.measure_duration_s is None else sim.measure_start_s + sim.measure_duration_s)


class Simulator(DecodeSide):
    def __init__(self, scenario: Scenario, timing: Any, policy: str, source: ArrivalSource,
                 progress: Progress | None = None) -> None:
        self.scenario = scenario
        self.timing = timing
        self.policy = policy
        self.source = source
        self.progress = progress
        cfg = scenario.config
        # KV is tracked per group of `kv_block_multiple` target blocks: the group's last chained hash
        # names the whole prefix, so grouping only coarsens hit granularity (a speed knob).
        self.group = scenario.sim.kv_block_multiple
        self.target_block_tokens = cfg.timing.target_block_tokens
        self.block_tokens = self.target_block_tokens * self.group
        self.now = 0.0
        self.sizing = size_scenario(scenario)
        self.metrics = MetricsCollector(*measured_window(scenario))
        self.queue = EventQueue()
        self.prefill = self._build("prefill", cfg.deployment.prefill)
        self.decode = self._build("decode", cfg.deployment.decode)
        self.cost = router_cost(timing, scenario)  # the one price of queued work: the router's table
        # the simulator's caches and pool keep every chain prefix-closed: no orphan bookkeeping
        self.router = Router(make_policy(policy, policy_settings(cfg.routing, self.cost)),
                             PrefixIndex(closed_chains=True))
        sz = self.sizing
        block_bytes = int(sz.kv_bytes_per_token * self.target_block_tokens)
        caches = {(inst.name, r): max(1, inst.cache_tokens // self.block_tokens)
                  for inst in self.prefill for r in range(len(inst.ranks))}
        self.kv = self._cluster_kv(caches, block_bytes)
        self._where = {inst.name: (i, "prefill") for i, inst in enumerate(self.prefill)}
        self._where.update({inst.name: (i, "decode") for i, inst in enumerate(self.decode)})
        self._view = LiveClusterView([self._state(key) for key in self._all_keys()])
        # the planner (scenario `planner:`) activates and drains the instances built above
        self.planner = None if scenario.planner is None else SimPlanner(self, scenario.planner)
        self._versions = [0] * len(self.decode)
        self._leaps: list[Leap | None] = [None] * len(self.decode)
        self._decode_waiting: list[set[int]] = [set() for _ in self.decode]  # ranks with waiting seqs
        self._events = 0
        metrics = self.metrics
        self.idle_watch = RankIdleWatch(self.prefill, self.decode, lambda: (  # no window while the warm-ups hold it
            (math.inf, None) if self._awaits_release else (metrics.window_start_s, metrics.window_end_s)))
        self.prefill_kv_wait_s = 0.0  # prefill steps' waits for pooled KV in the window (issue 32)
        # a source that holds its lanes until its warm-ups are done (TraceReplaySource warmup_first)
        # moves the measured window to start from that moment
        self._awaits_release = getattr(source, "released_at_s", 0.0) is None
        self._windowed = False
        self._sent = self._done = 0  # requests arrived / finished or rejected (for progress ticks)
        self._total: int | None = None

    # ---- construction ---------------------------------------------------------------------------
    def _build(self, role: str, groups: list) -> list[Instance]:
        sim, sz = self.scenario.sim, self.sizing
        out: list[Instance] = []
        for g, group in enumerate(groups):
            layout = make_layout(self.timing, group.layout, group.gpus, group.moe_tp)
            for _ in range(group.count):
                idx = len(out)
                name = f"{role}-{idx}"
                if role == "prefill":
                    limits = SchedulerLimits(sz.prefill_chunk_tokens, sz.prefill_max_seqs, sim.max_queue_per_rank)
                    ranks = [RankScheduler(limits, self._on_prefill_start(name, r)) for r in range(group.dp_ranks)]
                    cache = sz.prefill_cache_tokens[g]
                else:
                    limits = SchedulerLimits(sim.decode_max_num_batched_tokens, sz.decode_max_seqs[g], sim.max_queue_per_rank,
                                             reserve_kv_tokens=None if self._decode_kv_override(g) else sz.decode_kv_tokens[g])
                    clock = DecodeClock(group.dp_ranks)  # the lazy path's lockstep ranks step together
                    ranks = [RankScheduler(limits, kv=self._decode_ledger(g), decode_clock=clock, rank=r)
                             for r in range(group.dp_ranks)]
                    cache = 0
                out.append(Instance(name, group.layout, layout, group.gpus, ranks, cache_tokens=cache))
        return out

    def _cluster_kv(self, caches: dict[tuple[str, int], int], block_bytes: int) -> ClusterKV:
        """The rank caches and the pool(s) of pool.scope (sim/pool_scope.py), with their paths."""
        cfg, sz = self.scenario.config, self.sizing
        hw = getattr(self.timing, "hardware", None)
        pools = scoped_pools(cfg.pool.scope, [(i.name, i.gpus) for i in self.prefill], self.scenario.gpus,
                             sz.pool_hbm, sz.pool_dram, getattr(hw, "host_link_bw_bytes_per_s", None))
        setup = {"pool_hbm": cfg.pool.hbm_transfer_setup_s, "pool_dram": cfg.pool.dram_transfer_setup_s}
        scoped = [(p.instances, pool_limits(int(p.pool_hbm.capacity_bytes), int(p.pool_dram.capacity_bytes),
                                            cfg.pool.high_watermark, cfg.pool.low_watermark),
                   PoolPaths({"pool_hbm": p.pool_hbm, "pool_dram": p.pool_dram}, setup)) for p in pools]
        rack = scoped[0]
        return ClusterKV(caches, rack[1], self.target_block_tokens, block_bytes, self.router.index, rack[2],
                         scoped=scoped if len(scoped) > 1 else None, event_lag_s=cfg.routing.event_lag_s)

    def _all_keys(self) -> list[tuple[str, int]]:
        return [(i.name, r) for i in (*self.prefill, *self.decode) for r in range(len(i.ranks))]

    def _state(self, key: tuple[str, int]) -> RankState:
        idx, role = self._where[key[0]]
        inst = (self.prefill if role == "prefill" else self.decode)[idx]
        return RankState(key[0], key[1], inst.layout_name, role)  # type: ignore[arg-type]

    def _update_prefill(self, key: tuple[str, int], tokens: int, work_s: float, blocks: int = 0) -> None:
        """A prefill rank's queue grew (or shrank) by `tokens` uncached tokens and `work_s` seconds,
        its prompts in flight by `blocks` KV blocks (what Dynamo's cost calls their active blocks)."""
        old = self._view.state(key)
        self._view.replace(RankState(old.instance, old.dp_rank, old.layout, old.role, old.queued_tokens + tokens,
                                     old.queued_work_s + work_s, old.active_decode_blocks + blocks, old.running_seqs,
                                     old.healthy))

    def _update_decode(self, key: tuple[str, int], blocks: int, seqs: int) -> None:
        """A decode rank got (or lost) `seqs` sequences holding `blocks` KV blocks."""
        old = self._view.state(key)
        self._view.replace(RankState(old.instance, old.dp_rank, old.layout, old.role, old.queued_tokens,
                                     old.queued_work_s, old.active_decode_blocks + blocks, old.running_seqs + seqs,
                                     old.healthy))

    # ---- run --------------------------------------------------------------------------------------
    @rare_full_collections  # sim/gc_policy.py: millions of long-lived blocks
    def run(self) -> SimResult:
        wall, cpu = time.perf_counter(), time.process_time()
        initial = self.source.start()
        # requests the run will see when known up front: a trace's length, a uniform closed loop's count
        self._total = len(initial) if isinstance(self.source, ListSource) else getattr(self.scenario.workload,
                                                                                        "requests", None)
        self.queue.preload([Arrival(req.arrival_s, req) for req in initial])
        if self.planner is not None:
            self.queue.push(self.planner.first_tick())
        metrics = self.metrics
        if self._awaits_release and self.source.released_at_s is not None:  # type: ignore[attr-defined]
            self._move_window(self.source.released_at_s)  # type: ignore[attr-defined]  # nothing to wait for
        self._windowed = metrics.window_start_s <= 0.0 and not self._awaits_release
        next_event = self.queue.pop_or_none
        push = self.queue.push
        while (event := next_event()) is not None:
            end = metrics.window_end_s
            if end is not None and event.time > end and not self._awaits_release:
                break  # the measured window is over
            if not self._windowed and event.time >= metrics.window_start_s:
                self._windowed = True
                for inst in (*self.prefill, *self.decode):
                    inst.start_window()
            self.now = event.time
            self._events += 1
            for new in event.handle(self):
                push(new)
        if self.progress is not None:
            self.progress(self._tick(final=True))
        return build_result(self, time.perf_counter() - wall, time.process_time() - cpu)

    def _tick(self, final: bool = False) -> ProgressTick:
        return ProgressTick(self._done, self._sent, self._total, self.now, self._end_s(), final)

    def _end_s(self) -> float | None:
        """Where the run stops on the simulated clock, when known: the window's end, else the
        horizon, else the workload's last send (closed loop)."""
        if self.metrics.window_end_s is not None:
            return self.metrics.window_end_s
        if self.scenario.sim.horizon_s is not None:
            return self.scenario.sim.horizon_s
        duration = getattr(self.scenario.workload, "duration_s", None)
        return None if duration is None else float(duration)

    def _keys(self, req: Request) -> BlockKeys:
        return BlockKeys.of(req.block_hashes, self.group)

    def _followups(self, req: Request, now: float) -> list[Event]:
        self._done += 1
        if self.progress is not None and self._done % TICK_EVERY == 0:
            self.progress(self._tick())
        out = [Arrival(r.arrival_s, r) for r in self.source.on_done(req, now)]
        if self._awaits_release and self.source.released_at_s is not None:  # type: ignore[attr-defined]
            self._move_window(self.source.released_at_s)  # type: ignore[attr-defined]
        return out

    def _move_window(self, released_s: float) -> None:
        """The source's lanes went on at `released_s` after their warm-ups: the measured window
        counts from there (what ran before is left out, as the warm-ups are)."""
        self._awaits_release, self._windowed = False, False
        self.metrics.window_start_s += released_s
        if self.metrics.window_end_s is not None:
            self.metrics.window_end_s += released_s

    # ---- arrivals and prefill ---------------------------------------------------------------------
    def on_arrival(self, now: float, req: Request) -> list[Event]:
        horizon = self.scenario.sim.horizon_s
        if horizon is not None and now > horizon:
            return []
        self.metrics.on_arrival(now, req)
        if self.planner is not None:
            self.planner.on_arrival(req)
        self._sent += 1
        keys = self._keys(req)
        view = RequestView(keys.keys, req.prompt_tokens, self.block_tokens, str(req.req_id))
        self.kv.advance(now)  # the router sees what has committed (and been heard of) by now
        cuts = self.kv.lag_cuts
        decision = self.router.route(view, self._view)  # type: ignore[arg-type]  # a ClusterView's interface
        p_idx, _ = self._where[decision.instance]
        d_idx, _ = self._where[decision.decode_instance]
        flight = Flight(req, (p_idx, decision.dp_rank), (d_idx, decision.decode_dp_rank), decision.predicted)
        flight.keys = keys
        # the router's match is the truth when the event lag hid nothing from it
        flight.regret_s = self._regret(view, decision.key, decision.match if self.kv.lag_cuts == cuts else None)
        if self.scenario.config.pool.prefetch_while_queued:
            self._look_up(flight, decision.key, now)  # the rank fetches the pooled part while the prompt queues
        inst = self.prefill[p_idx]
        cached = decision.predicted.total
        flight.queued_work_s = self.cost.prefill_estimate_s(inst.layout_name, req.prompt_tokens - cached, cached)
        seq = SeqState(req.req_id, req.prompt_tokens, 1, payload=flight)  # samples the first token
        flight.decode_blocks = math.ceil((req.prompt_tokens + req.output_tokens) / self.target_block_tokens)
        self._queue_load(flight, decision.key, +1)
        return self._admit_prefill(now, flight, seq)

    def on_planner_tick(self, now: float) -> list[Event]:
        return self.planner.on_tick(now)  # type: ignore[union-attr]  # pushed only with a planner

    def on_instance_ready(self, now: float, slot: object) -> list[Event]:
        return self.planner.on_instance_ready(now, slot)  # type: ignore[union-attr,arg-type]

    def _queue_load(self, flight: Flight, key: tuple[str, int], sign: int) -> None:
        req, cached = flight.request, flight.predicted.total
        self._update_prefill(key, sign * (req.prompt_tokens - cached), sign * flight.queued_work_s,
                             sign * math.ceil(req.prompt_tokens / self.block_tokens))
        d_idx, d_rank = flight.decode
        self._update_decode((self.decode[d_idx].name, d_rank), sign * flight.decode_blocks, sign)

    def _admit_prefill(self, now: float, flight: Flight, seq: SeqState) -> list[Event]:
        """The routed prompt joins its prefill rank's queue (or is rejected when that is full)."""
        p_idx, rank = flight.prefill
        inst = self.prefill[p_idx]
        if not inst.ranks[rank].admit(seq):
            self.metrics.rejected += 1
            self._queue_load(flight, (inst.name, rank), -1)
            return self._followups(flight.request, now)
        self.idle_watch.changed(now, "prefill", p_idx)
        if inst.busy:
            return []
        inst.busy = True  # a kick is pending: later arrivals of this instant only queue
        return [PrefillKick(now, p_idx)]

    def on_prefill_kick(self, now: float, idx: int) -> list[Event]:
        return self._start_prefill_step(now, idx)

    def _on_prefill_start(self, name: str, rank: int) -> Callable[[SeqState], None]:
        key = (name, rank)

        def start(seq: SeqState) -> None:
            # The rank looks the prefix up when it queues the prompt (prefetch) or else when it first
            # schedules it (own HBM, committed pool blocks), and fetches the pooled part over the
            # pool's paths; the step waits for what has not arrived.
            flight: Flight = seq.payload
            req = flight.request
            if flight.fetch_ready < 0 or (self.kv.held_tokens(key, flight.keys, req.prompt_tokens, self.now)
                                          > flight.delivered.total):  # found more since the prefetch
                self._look_up(flight, key, self.now)
            flight.prefill_start = self.now
            seq.computed_tokens = flight.delivered.total

        return start

    def _look_up(self, flight: Flight, key: tuple[str, int], now: float) -> None:
        hit, ready = self.kv.delivered_hit(key, flight.keys, flight.request.prompt_tokens, now)
        flight.delivered, flight.fetch_ready = hit, ready

    def _regret(self, view: RequestView, chosen: tuple[str, int], routed: PrefixMatch | None = None) -> float:
        """Routing regret of a decision: least-uncached-work's estimate of when the prompt finishes
        prefill on the chosen rank less that on the best rank, both with the caches as they truly
        are (no event lag) and the ranks' queued work (rackserve/routing/regret.py). `routed`: the
        router's own match when the lag hid nothing from it (it is then the hindsight one)."""
        if routed is None:
            self.kv.truth(True)
            try:
                routed = self.router.match(view)
            finally:
                self.kv.truth(False)
        return regret_s(self.cost, view, self._view.prefill_ranks(), routed, chosen, cluster=self._view)

    def _start_prefill_step(self, now: float, idx: int) -> list[Event]:
        inst = self.prefill[idx]
        plans = [r.schedule() for r in inst.ranks]
        self.idle_watch.changed(now, "prefill", idx)
        if all(p.empty for p in plans):
            inst.busy = False
            return []
        fast = getattr(self.timing, "step_time_of", None)  # CachedTiming: keyed on totals, no arrays
        if fast is not None:
            cost = fast("prefill", inst.layout, [p.totals() for p in plans])
        else:
            cost = self.timing.step_time("prefill", inst.layout, StepBatch(tuple(p.rank_batch() for p in plans)))
        ready = now
        for sched, plan in zip(inst.ranks, plans, strict=True):
            for s in plan.seqs:
                ready = max(ready, sched.seq(s.req_id).payload.fetch_ready)
        cost = _wait_for_fetches(cost, now, ready)
        if self._windowed:
            self.prefill_kv_wait_s += max(0.0, ready - now)
        inst.account(cost, 1)
        inst.busy, inst.plans = True, plans
        return [PrefillStepEnd(now + cost.total_s, idx)]

    def on_prefill_step_end(self, now: float, idx: int) -> list[Event]:
        inst = self.prefill[idx]
        out: list[Event] = []
        for r, (sched, plan) in enumerate(zip(inst.ranks, inst.plans, strict=True)):
            for seq in sched.update(plan):
                out.append(self._prefilled(now, (inst.name, r), seq.payload))
        return out + self._start_prefill_step(now, idx)

    def _prefilled(self, now: float, key: tuple[str, int], flight: Flight) -> Event:
        req = flight.request
        self.kv.store(key, flight.keys, flight.delivered.total, now)
        self._update_prefill(key, -(req.prompt_tokens - flight.predicted.total), -flight.queued_work_s,
                             -math.ceil(req.prompt_tokens / self.block_tokens))
        flight.prefill_end = now
        self.metrics.on_prefilled(flight, now)
        return KVArrive(now + self.timing.pd_transfer_s(req.prompt_tokens), flight)
