"""The checks of rows that are not a whole run: one phase at saturation or at a measured speed, and one
stream, each priced by the same TimingModel the simulator uses. Whole runs (P/D serving and aggregated
instances) are replayed by the simulator (rackserve/validate/run.py, rackserve/sim/aggregated.py)."""

from __future__ import annotations

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
