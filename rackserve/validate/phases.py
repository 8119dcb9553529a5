"""The checks of rows that are not a whole P/D run: one phase at saturation or at a measured speed, one
stream, and an aggregated instance in closed loop, each priced by the same TimingModel the simulator uses.

Aggregated serving (one instance prefills and decodes, chunked prefill mixed into decode steps as vLLM,
SGLang and TensorRT-LLM schedule it) is solved in closed loop: `lanes` requests per DP rank, each a
prompt of ISL tokens then OSL / A decode steps (A accepted tokens per step). At arrival rate x per rank a
step carries b = x (OSL / A) T decoding sequences; a rank prefills whole chunks of the engine's token
budget, in a share q = x ISL T / budget of its steps, and the DP ranks step in lockstep, so a step lasts
T = decode step(b) + (1 - (1 - q)^dp) x the marginal price of a chunk beside the decodes;
a prompt's first token comes ceil(ISL / budget) steps after it joins, plus half a step, while the budget
holds, and once it binds the extra lanes wait (Little: lanes = x (TTFT + (OSL / A) T)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rackserve.timing.batch import RankBatch, StepBatch
from rackserve.timing.optimizations import parse_optimizations
from rackserve.timing.precision import with_precision
from rackserve.timing.spec import load_hardware, load_model
from rackserve.timing.timing_model import TimingModel
from rackserve.validate.mapping import LENGTH_SPREAD, Mapped, Workers

CHUNK_TOKENS = 8192  # the engines' default token budget per step (vLLM max_num_batched_tokens, TRT-LLM max_num_tokens)
MAX_BATCH = 4096


@dataclass(frozen=True)
class Figures:
    tput_per_gpu: float | None
    tps_user: float | None
    ttft_s: float | None
    detail: dict


def timing_model(m: Mapped, acceptance_length: float | None = None, hardware: dict | None = None) -> TimingModel:
    """The row's cost model; `acceptance_length` replaces the row's (and the model spec's) MTP length,
    `hardware` some of the hardware file's values (the fit's trial values)."""
    opts = parse_optimizations("baseline" if m.mtp else "baseline,-mtp")
    length = acceptance_length if acceptance_length is not None else m.acceptance_length
    hw = load_hardware(m.hardware)
    if hardware:
        hw = hw.model_copy(update=hardware)
    model = with_precision(load_model(m.model), m.expert_precision, m.attention_math)
    return TimingModel(hw, model, opts, acceptance_length=length)


def layout_of(tm: TimingModel, w: Workers):
    return tm.layout(w.layout, w.gpus, w.moe_tp)


def mean_length(tokens: int) -> float:
    """The mean of the benchmark's uniform draw in [(1 - spread) L, L]."""
    return tokens * (1.0 - LENGTH_SPREAD / 2.0)


def decode_batch(lay, seqs: int, context: float) -> StepBatch:
    rb = RankBatch.of([1] * seqs, [max(0, int(context) - 1)] * seqs)
    return StepBatch((rb,) * lay.dp)


def token_time(tm: TimingModel, lay, seqs: int, context: float) -> float:
    """Seconds per output token of a decode rank running `seqs` sequences at `context` (with MTP: the
    speculative step per accepted token)."""
    return tm.decode_token_time(lay, decode_batch(lay, seqs, context)).total_s


def prefill_phase(m: Mapped) -> Figures:
    """Input tok/s per prefill GPU of saturated steps: each rank a full chunk of the row's prompts."""
    tm = timing_model(m)
    lay = layout_of(tm, m.prefill)
    prompt = m.context_tokens
    per_rank = max(1, CHUNK_TOKENS // prompt)
    step = tm.step_time("prefill", lay, StepBatch((RankBatch.of([prompt] * per_rank),) * lay.dp))
    tput = per_rank * prompt * lay.dp / step.total_s / lay.gpus
    return Figures(tput, None, None, {"prompts_per_rank": per_rank, "step_s": step.total_s,
                                      "breakdown_s": step.breakdown})


def decode_at_speed(m: Mapped, tps_user: float) -> Figures:
    """Output tok/s per decode GPU at the largest batch whose per-token time meets 1 / tps_user."""
    tm = timing_model(m)
    lay = layout_of(tm, m.decode)
    target = 1.0 / tps_user
    if token_time(tm, lay, 1, m.context_tokens) > target:
        t = token_time(tm, lay, 1, m.context_tokens)
        return Figures(lay.dp / t / lay.gpus, None, None, {"batch_per_rank": 1, "speed_not_reached": 1.0 / t})
    lo, hi = 1, MAX_BATCH
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if token_time(tm, lay, mid, m.context_tokens) <= target:
            lo = mid
        else:
            hi = mid
    t = token_time(tm, lay, lo, m.context_tokens)
    return Figures(lo * lay.dp / t / lay.gpus, None, None, {"batch_per_rank": lo, "token_time_s": t})


def decode_saturated(m: Mapped) -> Figures:
    tm = timing_model(m)
    lay = layout_of(tm, m.decode)
    b = m.decode_batch_per_rank
    t = token_time(tm, lay, b, m.context_tokens)
    return Figures(b * lay.dp / t / lay.gpus, 1.0 / t, None, {"batch_per_rank": b, "token_time_s": t})


def single_stream(m: Mapped) -> Figures:
    tm = timing_model(m)
    lay = layout_of(tm, m.decode)
    t = token_time(tm, lay, 1, m.context_tokens)
    return Figures(None, 1.0 / t, None, {"token_time_s": t})


def aggregated(m: Mapped) -> Figures:
    """Closed-loop aggregated instance (module docstring): throughput over its GPUs, 1 / TPOT, TTFT."""
    tm = timing_model(m)
    lay = layout_of(tm, m.decode)
    isl, osl = mean_length(m.isl), mean_length(m.osl)
    accepted = tm.expected_accepted_tokens()
    lanes = m.concurrency / lay.dp
    context = isl + osl / 2.0
    prompt_steps = math.ceil(isl / CHUNK_TOKENS)

    def token_s(b: float) -> float:  # continuous in b: linear between the integer batches around it
        lo = max(1, math.floor(b))
        t_lo = token_time(tm, lay, lo, context)
        return t_lo + (b - lo) * (token_time(tm, lay, lo + 1, context) - t_lo) if b > lo else t_lo

    def excess(rate: float, t: float) -> float:
        b = max(1.0, rate * (osl / accepted) * t)
        # a rank prefills whole chunks, in a share q of its steps; the DP ranks step in lockstep (the
        # MoE dispatch is a barrier), so a step waits for a chunk whenever any of the dp ranks has one
        q = min(1.0, rate * isl * t / CHUNK_TOKENS)
        any_chunk = 1.0 - (1.0 - q) ** lay.dp
        chunk = min(CHUNK_TOKENS, isl)
        return accepted * token_s(b) + any_chunk * _prompt_price(tm, lay, round(b), context, chunk) - t

    def step_s(rate: float) -> float | None:
        """The step T solving T = step(b(T), p(T)) at this rate (bisection), None when none is
        under a minute (the rate is past what the instance can hold)."""
        lo, hi = 1e-5, 60.0
        if excess(rate, hi) > 0:
            return None
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            if excess(rate, mid) > 0:
                lo = mid
            else:
                hi = mid
        return hi

    def feasible(rate: float) -> bool:
        t = step_s(rate)
        return t is not None and rate * isl * t < CHUNK_TOKENS

    def lanes_at(rate: float) -> float:
        t = step_s(rate)
        return rate * ((prompt_steps + 0.5) * t + (osl / accepted) * t)

    lo, hi = 0.0, 1.0
    while feasible(hi) and lanes_at(hi) < lanes:
        hi *= 2.0
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        if feasible(mid) and lanes_at(mid) < lanes:
            lo = mid
        else:
            hi = mid
    rate = lo
    t = step_s(rate)
    held = lanes_at(rate)
    ttft = (prompt_steps + 0.5) * t
    # prompts join a rank's token budget as a queue: its Pollaczek-Khinchine wait at the budget's load
    # (M/D/1: rho S / (2 (1 - rho)), S = a prompt's steps; Kleinrock, Queueing Systems I, sec. 5.7)
    rho = min(rate * isl * t / CHUNK_TOKENS, 0.999)
    ttft += rho * prompt_steps * t / (2.0 * (1.0 - rho))
    bound = held < lanes * 0.999
    if bound:  # the token budget binds: the other lanes wait for their prompts
        ttft = max(ttft, lanes / rate - (osl / accepted) * t)
    tput = rate * lay.dp * (isl + osl) / lay.gpus
    return Figures(tput, accepted / t, ttft, {"requests_per_s_per_rank": rate, "step_s": t,
                                              "budget_bound": bound})


def _prompt_price(tm: TimingModel, lay, seqs: int, context: float, prompt_tokens: float) -> float:
    """What `prompt_tokens` of chunked prefill add to a step of `seqs` decoding sequences per rank: the
    mixed step's price less the same step without the chunk (both priced as prefill-phase steps)."""
    if prompt_tokens < 1:
        return 0.0
    dec = [1] * seqs
    ctx = [max(0, int(context) - 1)] * seqs
    with_chunk = RankBatch.of(dec + [int(prompt_tokens)], ctx + [0])
    without = RankBatch.of(dec, ctx)
    more = tm.step_time("prefill", lay, StepBatch((with_chunk,) * lay.dp)).total_s
    base = tm.step_time("prefill", lay, StepBatch((without,) * lay.dp)).total_s
    return max(0.0, more - base)
