"""Aggregated serving: instances whose DP ranks prefill and decode in the same steps (in-flight batching).

Each rank has the one scheduler of the live engine and the P/D simulator (rackserve/sched): a step
fills the token budget (`sim.max_num_batched_tokens`, TensorRT-LLM's max_num_tokens) with the running
sequences' decode tokens first and then prompts' chunks, FCFS, while fewer than `max_num_seqs` run. The
ranks of an instance step in lockstep (the MoE dispatch is a barrier), so a step lasts as long as its
slowest rank, and a prompt on one rank stalls the decodes of all.

A step is priced in the form its kernels run: the decode tokens as a decode step (with MTP: draft and
verify, per accepted token, `decode_token_time`), plus what the prompts' chunks add beside them as a
prefill-phase step (the step with the chunks less the same step without; engines run a batch's prefill
and decode tokens through separate attention kernels over shared GEMMs: vLLM's MLA backend splits a
batch into its decodes and prefills, vllm/v1/attention/backends/mla/common.py).

TensorRT-LLM's attention-DP balance (`sim.adp_balance_timeout_iters`; TensorRT-LLM tech blog 10, "ADP
Balance Strategy", and InferenceX's TRT-LLM scripts, which set enable_balance with timeout_iters 60):
while some ranks decode, a rank with a waiting prompt holds it until every rank has one, or until it has
held for timeout_iters steps; then all prefill in the same step. Fewer steps stall on one rank's
prompt, at the price of TTFT.

Requests go to the rank with the fewest sequences (waiting + running) over all instances, lowest index
first (TensorRT-LLM assigns attention-DP requests to balance the ranks' active requests). Decode
leaps over identical steps until the next event, as the P/D simulator's decode does.

Not modelled here (the P/D simulator has them): prefix caching and the KV pool (the engines of the
public aggregated points run with block reuse off on random prompts), KV-block admission (the batch is
bounded by max_num_seqs only) and the router's policies.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from rackserve.routing.view import PrefixHit
from rackserve.sched.limits import SchedulerLimits
from rackserve.sched.output import SchedulerOutput
from rackserve.sched.scheduler import RankScheduler
from rackserve.sched.seq_state import SeqState
from rackserve.sim.instances import Instance
from rackserve.sim.metrics import Flight, MetricsCollector, SimResult
from rackserve.sim.result import request_figures
from rackserve.sim.scenario import Scenario
from rackserve.sim.validity import run_validity
from rackserve.timing.batch import RankBatch, StepBatch, StepCost
from rackserve.workload.request import Request
from rackserve.workload.source import ArrivalSource

DEFAULT_MAX_NUM_TOKENS = 8192  # vLLM's max_num_batched_tokens (OpenAI server), TensorRT-LLM's max_num_tokens
DEFAULT_MAX_SEQS = 1024  # vLLM's max_num_seqs

ARRIVAL, STEP_END = 0, 1


@dataclass(eq=False)
class AggInstance:
    inst: Instance  # lockstep accounting and the step in flight (busy, plans), as the P/D simulator's
    held_steps: int = 0  # ADP balance: consecutive steps that held a waiting prompt back
    leap: int = 1  # steps the running step stands for (a leap over identical decode steps)


def mixed_cost(timing: Any, layout: Any, plans: list[SchedulerOutput], mid: int = 0) -> StepCost:
    """A step of `plans` (one per rank; module docstring): the decode tokens' decode step plus the
    prompts' chunks' marginal prefill-phase price. `mid`: context steps further on (a leap's middle)."""
    dec = [RankBatch.of([1] * sum(1 for s in p.seqs if s.num_new_tokens == 1),
                        [s.num_computed_tokens + mid for s in p.seqs if s.num_new_tokens == 1]) for p in plans]
    if not any(s.num_new_tokens > 1 for p in plans for s in p.seqs):
        return timing.decode_token_time(layout, StepBatch(tuple(dec)))
    base = timing.decode_token_time(layout, StepBatch(tuple(dec))) if any(b.num_seqs for b in dec) else None
    with_chunks = timing.step_time_of("prefill", layout, [p.totals() for p in plans])
    only_dec = timing.step_time_of("prefill", layout, [_decode_totals(p) for p in plans])
    extra = max(0.0, with_chunks.total_s - only_dec.total_s)
    n = len(plans)
    add = [max(0.0, _busy(with_chunks, r) - _busy(only_dec, r)) for r in range(n)]
    if base is None:  # prompts only: the prefill step itself
        return with_chunks
    busy = tuple(min(base.total_s + extra, _busy(base, r) + add[r]) for r in range(n))
    breakdown = dict(base.breakdown)
    breakdown["prefill_chunks"] = breakdown.get("prefill_chunks", 0.0) + extra
    return StepCost(base.total_s + extra, breakdown, busy, base.bound)


def _busy(cost: StepCost, r: int) -> float:
    return cost.rank_busy_s[r] if r < len(cost.rank_busy_s) else 0.0


def _decode_totals(p: SchedulerOutput) -> tuple[int, int, int, int, int]:
    n = dot = 0
    for s in p.seqs:
        if s.num_new_tokens == 1:
            n += 1
            dot += s.num_computed_tokens
    return n, n, dot, 0, 0


class AggregatedSimulator:
    """`AggregatedSimulator(scenario, timing, policy, source).run()` -> SimResult (module docstring)."""

    def __init__(self, scenario: Scenario, timing: Any, policy: str, source: ArrivalSource,
                 progress: Any = None) -> None:
        from rackserve.sim.simulator import (  # one layout rule, one window rule
            make_layout,
            measured_window,
        )

        self.scenario, self.timing, self.policy, self.source = scenario, timing, policy, source
        sim = scenario.sim
        budget = sim.max_num_batched_tokens or DEFAULT_MAX_NUM_TOKENS
        max_seqs = sim.decode_max_batch_seqs or sim.max_num_seqs or DEFAULT_MAX_SEQS
        limits = SchedulerLimits(budget, max_seqs, sim.max_queue_per_rank)
        self.balance = sim.adp_balance_timeout_iters
        self.instances: list[AggInstance] = []
        for group in scenario.config.deployment.aggregated:
            layout = make_layout(timing, group.layout, group.gpus, group.moe_tp)
            for _ in range(group.count):
                ranks = [RankScheduler(limits) for _ in range(group.dp_ranks)]
                name = f"aggregated-{len(self.instances)}"
                self.instances.append(AggInstance(Instance(name, group.layout, layout, group.gpus, ranks)))
        self.metrics = MetricsCollector(*measured_window(scenario))
        self.now = 0.0
        self._heap: list[tuple[float, int, int, Any]] = []
        self._order = itertools.count()
        self._events = self._sent = self._done = 0
        self._windowed = False
        self._load: list[tuple[float, float, int]] = []  # per step in the window: (seconds, seqs per rank, busiest)

    # ---- events -------------------------------------------------------------------------------------
    def _push(self, t: float, kind: int, data: Any) -> None:
        heapq.heappush(self._heap, (t, next(self._order), kind, data))

    def run(self) -> SimResult:
        wall, cpu = time.perf_counter(), time.process_time()
        for req in self.source.start():
            self._push(req.arrival_s, ARRIVAL, req)
        m = self.metrics
        self._windowed = m.window_start_s <= 0.0
        while self._heap:
            t, _, kind, data = heapq.heappop(self._heap)
            if m.window_end_s is not None and t > m.window_end_s:
                break
            if not self._windowed and t >= m.window_start_s:
                self._windowed = True
                for a in self.instances:
                    a.inst.start_window()
            self.now = t
            self._events += 1
            if kind == ARRIVAL:
                self._arrive(t, data)
            else:
                self._step_end(t, data)
        return self._result(time.perf_counter() - wall, time.process_time() - cpu)

    def _arrive(self, now: float, req: Request) -> None:
        horizon = self.scenario.sim.horizon_s
        if horizon is not None and now > horizon:
            return
        self.metrics.on_arrival(now, req)
        self._sent += 1
        i, r = min(((i, r) for i, a in enumerate(self.instances) for r in range(len(a.inst.ranks))),
                   key=lambda ir: (len(self.instances[ir[0]].inst.ranks[ir[1]]), ir))
        flight = Flight(req, (i, r), (i, r), PrefixHit())
        seq = SeqState(req.req_id, req.prompt_tokens, req.output_tokens, payload=flight)
        a = self.instances[i]
        if not a.inst.ranks[r].admit(seq):
            self.metrics.rejected += 1
            self._finished(req, now)
            return
        if not a.inst.busy:
            self._start_step(now, i)

    def _finished(self, req: Request, now: float) -> None:
        self._done += 1
        for nxt in self.source.on_done(req, now):
            self._push(nxt.arrival_s, ARRIVAL, nxt)

    # ---- steps --------------------------------------------------------------------------------------
    def _hold_prompts(self, a: AggInstance) -> bool:
        """ADP balance: hold waiting prompts back this step (module docstring)."""
        if self.balance is None:
            return False
        ranks = a.inst.ranks
        decoding = any(s.running for s in ranks)
        waiting = [bool(s.waiting) for s in ranks]
        if not decoding or not any(waiting) or all(waiting) or a.held_steps >= self.balance:
            return False
        return True

    def _start_step(self, now: float, idx: int) -> None:
        a = self.instances[idx]
        hold = self._hold_prompts(a)
        a.held_steps = a.held_steps + 1 if hold else 0
        plans = [s.schedule(admit=not hold) for s in a.inst.ranks]
        if all(p.empty for p in plans):
            a.inst.busy = False
            return
        for sched, p in zip(a.inst.ranks, plans, strict=True):
            for s in p.seqs:
                flight: Flight = sched.seq(s.req_id).payload
                if flight.prefill_start < 0:
                    flight.prefill_start = now
        steps = self._leap_steps(a, plans)
        cost = mixed_cost(self.timing, a.inst.layout, plans, (steps - 1) // 2)
        if steps > 1 and self._heap:  # end the leap at (or just after) the next event
            fit = max(1, math.floor((self._heap[0][0] - now) / cost.total_s))
            if fit < steps:
                steps = fit
                cost = mixed_cost(self.timing, a.inst.layout, plans, (steps - 1) // 2)
        a.inst.account(cost, steps)
        if self._windowed:
            running = [len(p.seqs) for p in plans]
            self._load.append((steps * cost.total_s, sum(running) / len(running), max(running)))
        a.inst.plans, a.leap, a.inst.busy = plans, steps, True
        self._push(now + steps * cost.total_s, STEP_END, idx)

    def _leap_steps(self, a: AggInstance, plans: list[SchedulerOutput]) -> int:
        """Identical decode steps the instance can run from here: every rank decodes only and none has a
        prompt waiting (so no step would differ but by context length)."""
        if any(s.waiting for s in a.inst.ranks):
            return 1
        return min((s.decode_leap_steps(p) for s, p in zip(a.inst.ranks, plans, strict=True)
                    if not p.empty), default=1)

    def _step_end(self, now: float, idx: int) -> None:
        a = self.instances[idx]
        for sched, plan in zip(a.inst.ranks, a.inst.plans, strict=True):
            stepped = [sched.seq(s.req_id) for s in plan.seqs]
            ended = sched.update(plan)
            for seq in stepped:
                self._first_token(seq, now)
            if a.leap > 1:
                ended += sched.advance_decode(a.leap - 1)
            for seq in ended:
                self._first_token(seq, now)
                flight: Flight = seq.payload
                self.metrics.on_finish(flight, now)
                self._finished(flight.request, now)
        self._start_step(now, idx)

    def _first_token(self, seq: SeqState, now: float) -> None:
        if seq.generated < 1:
            return
        flight: Flight = seq.payload
        if flight.first_token < 0:
            flight.prefill_end = flight.kv_arrive = flight.first_token = now
            flight.fetch_ready = flight.prefill_start
            self.metrics.on_prefilled(flight, now)

    # ---- result -------------------------------------------------------------------------------------
    def _result(self, wall_s: float, cpu_s: float) -> SimResult:
        m = self.metrics
        span = m.span_s()
        gpus = self.scenario.gpus
        insts = [a.inst for a in self.instances]
        stepping = sum(i.stepping_s * len(i.ranks) for i in insts)
        idle = sum(sum(i.rank_idle_s) for i in insts) / stepping if stepping else 0.0
        util = sum(i.stepping_s for i in insts) / (span * len(insts)) if insts else 0.0
        validity = run_validity(self.source, m.completed, m.rejected, self._sent - self._done)
        limits = insts[0].ranks[0].limits
        figures = request_figures(m, self.scenario.name, self.policy, gpus, span, self._events, wall_s, cpu_s, validity)
        return SimResult(
            **figures, hit_rate=0.0, hit_rate_by_tier={"rank_hbm": 0.0, "pool_hbm": 0.0, "pool_dram": 0.0},
            predicted_hit_rate=0.0, prefill_idle_frac=idle, decode_idle_frac=idle,
            prefill_util=util, decode_stepping_share=util, pool_occupancy={"pool_hbm": 0.0, "pool_dram": 0.0},
            evictions={"rank_hbm": 0, "pool_hbm": 0, "pool_dram": 0},  # no prefix cache or pool here
            sizing={"aggregated": True, "max_num_batched_tokens": limits.max_num_batched_tokens,
                    "max_num_seqs": limits.max_num_seqs, "adp_balance_timeout_iters": self.balance},
            pool_scope="none", decode_load=self._decode_load(limits.max_num_seqs, m.output_tokens / span / gpus),
        )

    def _decode_load(self, max_seqs: int, tok_s_per_gpu: float) -> dict:
        """Sequences per rank over the window's steps (time-weighted mean and P90, the busiest rank's max), in
        the P/D report's shape (rackserve/sim/decode_load.py); no capacity figure: prefill shares the steps."""
        if not self._load:
            return {}
        t = np.array([x[0] for x in self._load])
        seqs = np.array([x[1] for x in self._load])
        order = np.argsort(seqs)
        cum = np.cumsum(t[order]) / t.sum()
        p90 = float(seqs[order][min(int(np.searchsorted(cum, 0.9)), len(order) - 1)])
        return {"seqs_per_rank_mean": float(np.dot(t, seqs) / t.sum()), "seqs_per_rank_p90": p90,
                "seqs_per_rank_max": max(x[2] for x in self._load), "max_num_seqs": max_seqs,
                "tok_s_per_gpu": tok_s_per_gpu, "capacity_tok_s_per_gpu_at_batch": float("nan"),
                "bound": {"prefill": "aggregated: prompts share the decode steps",
                          "decode": "aggregated: decode shares the steps with prompts"}}
