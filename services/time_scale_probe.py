"""`rackserve up --time-scale auto`: the time_scale this machine can hold without pacing lag.

A live step lasts max(real compute, simulated step x time_scale) of wall time (services/pacing.py);
when the compute is longer the twin lags and a client's wall-clock figures stop being simulated
time x time_scale. This probe runs the small model in this process on the deployment's own step
shapes (a 512-token prefill; a decode step of `decode_seqs` sequences), prices the same steps
with the cost model, and picks the smallest round time_scale at which every probed step, plus a
fixed allowance for the lockstep's Ray round trip, fits its paced budget with `headroom` to
spare (the probe runs alone; the live cluster shares the cores with its other processes).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from rackserve.config import Config
from rackserve.model.engine import Engine
from rackserve.model.mock_engine import MockEngine
from rackserve.model.sampling import SamplingParams
from rackserve.model.threads import limit_blas_threads
from rackserve.timing import TimingModel
from rackserve.timing.batch import RankBatch, StepBatch
from services.topology import InstanceSpec, instances

STEP_OVERHEAD_S = 0.002  # one lockstep: Ray actor calls (~0.8 ms each, ENVIRONMENT.md) + gather
DEFAULT_HEADROOM = 3.0  # the live cluster's ~12 processes share the cores the probe had alone
DEFAULT_DECODE_SEQS = 8  # a load client at concurrency 4-8 on one decode instance
DECODE_STEPS = 6  # timed decode steps; the median counts
PROBE_PREFILL_TOKENS = 512  # a load client's prompt (a longer chunk costs about as much per token)


@dataclass(frozen=True)
class ProbedStep:
    phase: str
    shape: str  # e.g. "512 tokens", "8 seqs"
    compute_s: float  # wall seconds this machine took (median)
    sim_s: float  # simulated seconds the cost model charges

    @property
    def scale_needed(self) -> float:
        return (self.compute_s + STEP_OVERHEAD_S) / self.sim_s


@dataclass(frozen=True)
class ScalePick:
    time_scale: float
    headroom: float
    steps: tuple[ProbedStep, ...]

    def describe(self) -> str:
        parts = [
            f"{s.phase} step of {s.shape}: {s.compute_s * 1e3:.1f} ms here vs "
            f"{s.sim_s * 1e3:.2f} ms simulated" for s in self.steps
        ]
        return (
            f"time_scale auto: {self.time_scale:g} wall s per simulated s ({'; '.join(parts)}; "
            f"+{STEP_OVERHEAD_S * 1e3:.0f} ms per step, x{self.headroom:g} headroom)"
        )


def round_up_125(x: float) -> float:
    """The smallest of 1, 2, 5 x 10^k that is >= x (a time_scale a person can read)."""
    exponent = math.floor(math.log10(x))
    for mantissa in (1, 2, 5, 10):
        candidate = mantissa * 10.0**exponent
        if candidate >= x * (1 - 1e-9):
            return float(f"{candidate:.6g}")
    raise AssertionError("unreachable")


def _price(timing: TimingModel, spec: InstanceSpec, phase: str, batch: RankBatch) -> float:
    layout = timing.layout(spec.layout, spec.gpus if spec.layout == "wide-ep" else None)
    idle = [RankBatch.of([])] * (spec.dp_ranks - 1)
    return timing.step_time(phase, layout, StepBatch((batch, *idle))).total_s


def _timed_step(engine: Engine) -> tuple[float, RankBatch]:
    started = time.perf_counter()
    result = engine.step()
    return time.perf_counter() - started, result.rank_batch()


def probe(cfg: Config, decode_seqs: int = DEFAULT_DECODE_SEQS, headroom: float = DEFAULT_HEADROOM
          ) -> ScalePick:
    limit_blas_threads(1)  # as a rank actor runs (one BLAS thread)
    timing = TimingModel.from_section(cfg.timing)
    engine = MockEngine.from_deployment(cfg) if cfg.engine.kind == "mock" else Engine.from_deployment(cfg)
    params = SamplingParams(max_tokens=DECODE_STEPS + 2, temperature=0.0, ignore_eos=True)
    chunk = min(cfg.engine.max_num_batched_tokens, PROBE_PREFILL_TOKENS)
    engine.add_request("probe-warmup", [66] * 32, params)  # first-call costs are not steps
    while engine.has_unfinished():
        engine.step()
    engine.add_request("probe-prefill", [65 + i % 26 for i in range(chunk)], params)
    wall_s, batch = _timed_step(engine)
    engine.free("probe-prefill")
    steps = [ProbedStep("prefill", f"{chunk} tokens", wall_s,
                        _price(timing, instances(cfg, "prefill")[0], "prefill", batch))]
    for i in range(decode_seqs):
        engine.add_request(f"probe-decode-{i}", [97 + (i + j) % 26 for j in range(64)], params)
    while engine.step().num_prefill_tokens:
        pass  # prefill the decode sequences (untimed)
    timed = sorted(_timed_step(engine) for _ in range(DECODE_STEPS))
    wall_s, batch = timed[len(timed) // 2]
    spec = instances(cfg, "decode")[0]
    steps.append(ProbedStep("decode", f"{batch.num_seqs} seqs", wall_s,
                            _price(timing, spec, "decode", batch)))
    need = max(s.scale_needed for s in steps) * headroom
    return ScalePick(round_up_125(need), headroom, tuple(steps))
