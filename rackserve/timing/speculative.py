"""Speculative decoding by the model's own draft layers (MTP): per step, one verify pass of the
main model checks each sequence's block_tokens positions, the accepted prefix (+ the verifier's own
next token) is kept, and the draft layers then propose the next block_tokens - 1 tokens.

Acceptance is a benchmark parameter, not a measurement: the AgentX harness pins a "golden"
acceptance length per model (REFERENCE.md, "How the benchmark measures": 2.49 accepted tokens per
step for its DeepSeek-V4 entries), so the model YAML's `mtp.acceptance_length` is that value and
`timing.speculative.acceptance_length` may replace it. The per-position rates of the YAML give the
shape only: draft i is kept only if drafts 1..i-1 were, with P(kept | earlier kept) = s a_i (capped
at 1), s chosen so that 1 + s a_1 + s a_1 s a_2 + ... equals the acceptance length.

Drafting runs one draft pass after another, one token each (vLLM v1 spec_decode/eagle.py
`propose`: a first pass over the step's verified positions, then num_speculative_tokens - 1 passes of
one token per request, each feeding the last draft back in), so the draft is priced pass by pass: a
one-layer model (draft_model(layers=1): the draft's experts and top-k, window attention, the main
model's widths, dtypes and LM head) over the verify block, then draft_tokens - 1 single-token passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from operator import mul

import numpy as np

from rackserve.timing.batch import RankBatch, StepBatch
from rackserve.timing.spec import ModelSpec


@dataclass(frozen=True)
class Speculation:
    """What the scheduler and the cost model need to know about one step of speculative decoding."""

    verify_tokens: int  # positions each decoding sequence computes per step (drafts + 1)
    expected_accepted_tokens: float  # tokens a sequence gains per step, on average
    acceptance: tuple[float, ...]  # per draft position, P(kept | every earlier draft kept)

    @property
    def draft_tokens(self) -> int:
        return self.verify_tokens - 1

    def accepted_distribution(self) -> np.ndarray:
        """P(the step keeps exactly n tokens), n = 1 .. verify_tokens (sums to 1)."""
        reach = np.array([1.0, *accumulate(self.acceptance, mul)])  # P(at least n tokens)
        return reach - np.append(reach[1:], 0.0)


def expected_accepted(acceptance: tuple[float, ...] | list[float]) -> float:
    """1 + a_1 + a_1 a_2 + ...: the verifier's own token plus each kept draft."""
    return 1.0 + sum(accumulate(acceptance, mul))


def rates_for_length(shape: tuple[float, ...] | list[float], length: float) -> tuple[float, ...]:
    """Per-position rates s x shape (each capped at 1) whose expected accepted tokens is `length`
    (1 <= length <= 1 + drafts), by bisection on s (the expectation grows with s)."""
    shape = tuple(shape)
    if not 1.0 <= length <= 1.0 + len(shape):
        raise ValueError(f"acceptance_length: must be in [1, {1 + len(shape)}] for {len(shape)} drafts, got {length}")
    if length == 1.0 + len(shape):
        return (1.0,) * len(shape)
    lo, hi = 0.0, 1.0 / max(min(a for a in shape if a > 0), 1e-9) if any(shape) else 1.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if expected_accepted([min(1.0, mid * a) for a in shape]) < length:
            lo = mid
        else:
            hi = mid
    return tuple(min(1.0, hi * a) for a in shape)


def with_drafts(model: ModelSpec, drafts: int | None) -> ModelSpec:
    """The model verifying `drafts` draft tokens per step instead of its spec's (TensorRT-LLM's MTP
    num_nextn_predict_layers: InferenceX runs DeepSeek-R1 with 1 under attention DP and 3 without,
    benchmarks/dsr1_fp8_h200_trt_mtp.sh). The first `drafts` positions keep their rates as the spec's
    pinned length discounts them (rates_for_length over all positions, then cut), so a fitted length
    carries over; the length is then what those rates give. None: the spec unchanged."""
    if drafts is None or model.mtp is None or drafts == model.mtp.block_tokens - 1:
        return model
    shape = model.mtp.acceptance
    if not 1 <= drafts <= len(shape):
        raise ValueError(f"speculative.drafts: {model.name} has acceptance rates for 1..{len(shape)} drafts, got {drafts}")
    pinned = model.mtp.acceptance_length
    rates = tuple(shape) if pinned is None else rates_for_length(shape, pinned)
    mtp = model.mtp.model_copy(update={"block_tokens": drafts + 1, "acceptance": list(rates[:drafts]),
                                       "acceptance_length": None})
    return model.model_copy(update={"mtp": mtp})


def speculation(model: ModelSpec, acceptance_length: float | None = None) -> Speculation | None:
    """The model's speculation parameters (accepted length: `acceptance_length`, else the model's
    pinned `mtp.acceptance_length`, else what its per-position rates give), or None without draft layers."""
    if model.mtp is None:
        return None
    length = acceptance_length if acceptance_length is not None else model.mtp.acceptance_length
    rates = tuple(model.mtp.acceptance) if length is None else rates_for_length(model.mtp.acceptance, length)
    return Speculation(model.mtp.block_tokens, expected_accepted(rates), rates)


def request_acceptance(spec: Speculation, steps: int, rng: np.random.Generator) -> float:
    """`acceptance: sampled`: one request's mean accepted tokens per step, the mean of its `steps`
    steps, each step's count drawn from the acceptance model's own distribution (drafts kept
    independently at the chained rates, as the expected-length formula assumes: Leviathan et al.,
    arXiv:2211.17192, sec. 3). Its mean is the acceptance length; its spread shrinks as 1/sqrt(steps)."""
    dist = spec.accepted_distribution()
    counts = rng.multinomial(max(steps, 1), np.clip(dist, 0.0, None) / dist.sum())
    return float(np.dot(counts, np.arange(1, spec.verify_tokens + 1))) / max(steps, 1)


def draft_model(model: ModelSpec, layers: int | None = None) -> ModelSpec:
    """The draft layers as a model of their own (same widths and formats, no Engram); `layers=1`:
    one draft pass (the layers run one after another, each pass one of them)."""
    assert model.mtp is not None
    mtp = model.mtp
    n = mtp.draft_layers if layers is None else layers
    data = model.model_dump()
    data.update(
        name=f"{model.name}-draft" + ("" if layers is None else f"-{n}"),
        layers=n,
        engram=None,
        mtp=None,
        prefill={"full_layers": n, "tail_tokens": 0},
    )
    data["attention"]["layer_codes"] = [mtp.draft_attention_code] * n
    data["moe"].update(experts=mtp.experts, top_k=mtp.top_k, first_dense_layers=0)
    return ModelSpec.model_validate(data)


def verify_batch(batch: StepBatch, verify_tokens: int) -> StepBatch:
    """The step's batch with every decoding sequence computing `verify_tokens` positions (the
    scheduler's one-token-per-sequence form widened to the verify block; cached tokens unchanged).
    A sequence computing more than one token (a newcomer's tail + first token, a recompute chunk)
    keeps its tokens: it has no drafts to verify in that step (mixed_step)."""
    return _per_rank(batch, lambda rb: RankBatch(
        np.where(rb.new_tokens == 1, verify_tokens, rb.new_tokens), rb.cached_tokens,
        rb.pool_hbm_tokens, rb.pool_dram_tokens))


def settled_batch(batch: StepBatch) -> StepBatch:
    """`batch` with every sequence computing one token, the longer ones' other tokens already
    cached: the plain decode step the same sequences run once the newcomers have caught up."""
    return _per_rank(batch, lambda rb: RankBatch(
        np.ones_like(rb.new_tokens), rb.cached_tokens + rb.new_tokens - 1, rb.pool_hbm_tokens, rb.pool_dram_tokens))


def draft_batches(batch: StepBatch, draft_tokens: int) -> list[StepBatch]:
    """The draft passes of a step whose verified (or computed) positions are `batch`: the first over
    those positions, then draft_tokens - 1 passes of one token per sequence, each one further on."""
    out = [batch]
    for i in range(1, draft_tokens):
        out.append(_per_rank(batch, lambda rb, i=i: RankBatch(
            np.ones_like(rb.new_tokens), rb.cached_tokens + rb.new_tokens + i - 1)))
    return out


def _per_rank(batch: StepBatch, make) -> StepBatch:
    ranks = batch.ranks
    # ranks that share one batch (a memo's representative) share its copy
    made = {k: make(rb) for k, rb in {id(rb): rb for rb in ranks}.items()}
    return StepBatch(tuple(map(made.__getitem__, map(id, ranks))), batch.expert_tokens)
