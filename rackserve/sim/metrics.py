"""Per-request records and the run summary: completions, throughput per GPU, TTFT/TPOT, hit rates.

Measured like AgentX: warm-up requests (Request.warmup) never count, and with a measured window
(start, length) only requests that finish inside it count, over the window's length; without one,
over the run's span. That is the one window rule (AgentX counts the successful requests of its
profiling window); only `arrivals`, a load figure, counts the requests that arrive inside it. Throughput per GPU counts cached + uncached input and output tokens.

Interactivity, as the AgentX harness defines it (SemiAnalysisAI/agentx-harness
utils/agentic/aggregation/request_metrics.py; InferenceX MODELS.md), per finished request:
- E2E-normalized (the headline): output tokens / (finish - arrival), so TTFT counts against it;
- ITL-based (the diagnostic): (output - 1) / (finish - first token) = 1 / TPOT.
"P90" is the slow tail: 1 / p90(seconds per output token) over the requests; P50 is 1 / p50 of the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from rackserve.routing.view import PrefixHit
from rackserve.workload.request import Request


@dataclass(eq=False)
class Flight:
    """The simulator's record of one request in flight."""

    request: Request
    prefill: tuple[int, int]  # (instance index, rank index)
    decode: tuple[int, int]
    predicted: PrefixHit
    keys: Any = None  # rackserve.sim.block_keys.BlockKeys of the prompt
    queued_work_s: float = 0.0
    delivered: PrefixHit = PrefixHit()
    decode_blocks: int = 0
    prefill_start: float = -1.0
    fetch_ready: float = -1.0  # when the pooled part of its prefix is in the prefill rank's HBM (-1: not looked up)
    regret_s: float = 0.0  # routing regret of its decision (rackserve/routing/regret.py)
    prefill_end: float = -1.0
    kv_arrive: float = -1.0
    first_token: float = -1.0


def is_warmup(request: Request) -> bool:
    return bool(getattr(request, "warmup", False))


TTFT_PARTS = ("queue", "kv_transfer", "prefill", "pd_transfer", "first_decode")


def ttft_parts(flight: Flight) -> tuple[float, ...]:
    """A finished request's TTFT as TTFT_PARTS (they add up to first token - arrival)."""
    arrival, start = flight.request.arrival_s, flight.prefill_start
    fetch = min(max(0.0, flight.fetch_ready - start), flight.prefill_end - start)
    return (start - arrival, fetch, flight.prefill_end - start - fetch, flight.kv_arrive - flight.prefill_end,
            flight.first_token - flight.kv_arrive)


@dataclass
class MetricsCollector:
    window_start_s: float = 0.0
    window_end_s: float | None = None
    arrivals: int = 0
    warmup_requests: int = 0
    rejected: int = 0
    preemptions: int = 0  # decode sequences that lost their KV (recompute) when blocks ran out
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    user_tps: list[float] = field(default_factory=list)
    e2e_s_per_token: list[float] = field(default_factory=list)  # (finish - arrival) / output tokens
    input_tokens: int = 0
    output_tokens: int = 0
    prompt_tokens_prefilled: int = 0
    hit_tokens: dict[str, int] = field(default_factory=lambda: {"rank_hbm": 0, "pool_hbm": 0, "pool_dram": 0})
    predicted_hit_tokens: int = 0
    # Issue 32: TTFT taken apart (sums over finished requests: queue, waiting for pooled KV, prefill
    # compute, P/D transfer, first decode step) and each decision's routing regret
    ttft_parts_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TTFT_PARTS, 0.0))
    regret_s: list[float] = field(default_factory=list)
    first_arrival: float = float("inf")
    last_finish: float = 0.0

    def in_window(self, now: float) -> bool:
        end = self.window_end_s
        return now >= self.window_start_s and (end is None or now < end)

    def on_arrival(self, now: float, request: Request | None = None) -> None:
        if request is not None and is_warmup(request):
            self.warmup_requests += 1
            return
        if not self.in_window(now):
            return
        self.arrivals += 1
        self.first_arrival = min(self.first_arrival, now)

    def on_prefilled(self, flight: Flight, now: float | None = None) -> None:
        if is_warmup(flight.request) or (now is not None and not self.in_window(now)):
            return
        self.prompt_tokens_prefilled += flight.request.prompt_tokens
        self.hit_tokens["rank_hbm"] += flight.delivered.rank_hbm
        self.hit_tokens["pool_hbm"] += flight.delivered.pool_hbm
        self.hit_tokens["pool_dram"] += flight.delivered.pool_dram
        self.predicted_hit_tokens += flight.predicted.total

    def on_finish(self, flight: Flight, now: float) -> None:
        req = flight.request
        if is_warmup(req) or not self.in_window(now):
            return
        self.ttft.append(flight.first_token - req.arrival_s)
        parts = self.ttft_parts_s
        for name, v in zip(TTFT_PARTS, ttft_parts(flight), strict=True):
            parts[name] += v
        self.regret_s.append(flight.regret_s)
        if req.output_tokens > 0:
            self.e2e_s_per_token.append((now - req.arrival_s) / req.output_tokens)
        if req.output_tokens > 1:
            span = now - flight.first_token
            self.tpot.append(span / (req.output_tokens - 1))
            self.user_tps.append((req.output_tokens - 1) / span if span > 0 else float("inf"))
        self.input_tokens += req.prompt_tokens
        self.output_tokens += req.output_tokens
        self.last_finish = max(self.last_finish, now)

    @property
    def completed(self) -> int:
        return len(self.ttft)

    def span_s(self) -> float:
        """The measured window's length, or (no window) first measured arrival to last finish."""
        if self.window_end_s is not None:
            return self.window_end_s - self.window_start_s
        start = self.first_arrival if self.arrivals else 0.0
        return max(self.last_finish - start, 1e-12)


@dataclass(frozen=True)
class SimResult:
    scenario: str
    policy: str
    gpus: int
    arrivals: int
    completed: int
    rejected: int
    span_s: float
    throughput_per_gpu: float  # (input + output tokens) / s / GPU
    output_tps_per_gpu: float
    user_tps_p50: float
    user_tps_p90: float  # the slower 10%: 10th percentile of speed
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    hit_rate: float
    hit_rate_by_tier: dict[str, float]
    predicted_hit_rate: float
    prefill_idle_frac: float  # lockstep idle / stepping time, prefill ranks
    decode_idle_frac: float
    prefill_util: float  # stepping time / span, prefill instances
    # stepping time / span, decode instances: NOT load (a lockstep instance steps back to back at any
    # batch); decode_load says how loaded decode is (issue 31: was decode_util)
    decode_stepping_share: float
    pool_occupancy: dict[str, float]
    evictions: dict[str, int]
    events: int
    wall_s: float
    cpu_s: float  # process CPU time of the run (wall time is noisy on a shared machine)
    recomputed_tokens: dict[str, int] = field(default_factory=dict)  # by the tier that lost the blocks
    pool_path_util: dict[str, float] = field(default_factory=dict)  # busy fraction of each pool path
    sizing: dict = field(default_factory=dict)  # rackserve.sim.sizing.Sizing.to_dict()
    warmup_requests: int = 0
    preemptions: int = 0  # vllm:num_preemptions_total of the decode ranks
    ttft_samples: list[float] = field(default_factory=list, repr=False)
    # AgentX interactivity (module docstring): 1 / pNN of seconds per output token
    tps_user_e2e_p50: float = float("nan")
    tps_user_e2e_p90: float = float("nan")
    tps_user_itl_p50: float = float("nan")
    tps_user_itl_p90: float = float("nan")
    # Issue 32: lockstep idle of each prefill instance (its rank pair for DEP2) and of each rank
    # ("prefill-0/1"), over the instance's stepping time
    prefill_idle_by_instance: dict[str, float] = field(default_factory=dict)
    prefill_idle_by_rank: dict[str, float] = field(default_factory=dict)
    ttft_breakdown_s: dict[str, float] = field(default_factory=dict)  # mean seconds of TTFT per part (TTFT_PARTS)
    prefill_kv_transfer_frac: float = 0.0  # of the prefill instances' stepping time, waiting for pooled KV
    regret_mean_s: float = 0.0  # routing regret per decision (rackserve/routing/regret.py)
    regret_p90_s: float = 0.0
    pool_scope: str = "rack"
    # Issue 31: decode load (rackserve/sim/decode_load.py: sequences per rank mean/P90/max, decode
    # tok/s/GPU against the modelled capacity at that batch, what bounds each role) and AgentX validity
    # (rackserve/sim/validity.py); figures count the requests that finish inside the measured window
    decode_load: dict = field(default_factory=dict)
    valid: bool = True
    invalid_reasons: list[str] = field(default_factory=list)
    overflow_share: float = 0.0
    metric_coverage: float = 1.0
    # Issue 50: idle as operators read it (rackserve/sim/rank_idle.py): per role, the mean share of the
    # window a rank had nothing to compute while requests waited at another rank of its role (and had
    # nothing at all), per rank the first; the pool's capacity (every tier) and its working set against
    # it over time (rackserve/sim/pool_trace.py)
    prefill_idle_waiting_frac: float = 0.0
    decode_idle_waiting_frac: float = 0.0
    prefill_empty_frac: float = 0.0
    decode_empty_frac: float = 0.0
    idle_waiting_by_rank: dict[str, float] = field(default_factory=dict)
    pool_capacity_bytes: float = 0.0
    pool_trace: dict = field(default_factory=dict)
    # Issue 52: a planned run's SLA attainment, GPU-hours and per-tick timeline (rackserve/sim/planned.py);
    # empty (and left out of to_dict) without a `planner:` section
    planner: dict = field(default_factory=dict)

    def to_dict(self, samples: bool = False) -> dict:
        out = asdict(self)
        if not samples:
            out.pop("ttft_samples")
        if not self.planner:
            out.pop("planner")
        return out


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def slow_tail_speed(seconds_per_token: list[float], q: float) -> float:
    """Interactivity at percentile q as AgentX reads it: 1 / p_q(seconds per output token), so
    q=90 is the slow tail (90% of requests were at least this fast)."""
    v = pct(seconds_per_token, q)
    return 1.0 / v if v > 0 else float("nan")


def ideal_hit_rate(requests: Iterable[Request], block_tokens: int) -> float:
    """Hit rate of an infinite cache that holds every block of every earlier request (prompt order),
    each hit capped at prompt - 1 tokens like a real prefill."""
    seen: set[int] = set()
    hit = total = 0
    for req in requests:
        n = 0
        for h in req.block_hashes:
            if h not in seen:
                break
            n += 1
        hit += min(n * block_tokens, req.prompt_tokens - 1)
        total += req.prompt_tokens
        seen.update(req.block_hashes)
    return hit / total if total else 0.0
