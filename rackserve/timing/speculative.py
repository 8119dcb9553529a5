"""Speculative decoding by the model's own draft layers (MTP): per step, one draft pass proposes
block_tokens - 1 tokens per sequence, one verify pass of the main model checks the block's
block_tokens positions, and the accepted prefix (+ the verifier's own next token) is kept.

Acceptance model: draft i is kept only if drafts 1..i-1 were, with P(kept | earlier kept) = a_i (the
spec's per-position rates), so the expected tokens a sequence gains per step is
1 + a_1 + a_1 a_2 + ... + a_1 ... a_k. The draft layers are priced as a small model of their own
(draft_model): draft_layers MoE layers with the draft's experts and top-k, window attention,
sharing the main model's widths, dtypes and LM head shape.
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


def speculation(model: ModelSpec) -> Speculation | None:
    """The model's speculation parameters, or None when it has no draft layers."""
    if model.mtp is None:
        return None
    rates = tuple(model.mtp.acceptance)
    return Speculation(model.mtp.block_tokens, expected_accepted(rates), rates)


def draft_model(model: ModelSpec) -> ModelSpec:
    """The draft layers as a model of their own (same widths and formats, no Engram)."""
    assert model.mtp is not None
    mtp = model.mtp
    data = model.model_dump()
    data.update(
        name=f"{model.name}-draft",
        layers=mtp.draft_layers,
        engram=None,
        mtp=None,
        prefill={"full_layers": mtp.draft_layers, "tail_tokens": 0},
    )
    data["attention"]["layer_codes"] = [mtp.draft_attention_code] * mtp.draft_layers
    data["moe"].update(experts=mtp.experts, top_k=mtp.top_k, first_dense_layers=0)
    return ModelSpec.model_validate(data)


def verify_batch(batch: StepBatch, verify_tokens: int) -> StepBatch:
    """The step's batch with every decoding sequence computing `verify_tokens` positions (the
    scheduler's one-token-per-sequence form widened to the verify block; cached tokens unchanged)."""
    made: dict[int, RankBatch] = {}  # ranks that share one batch (a memo's representative) share its widening
    for rb in batch.ranks:
        if id(rb) not in made:
            made[id(rb)] = RankBatch(
                np.full_like(rb.new_tokens, verify_tokens),
                rb.cached_tokens,
                rb.pool_hbm_tokens,
                rb.pool_dram_tokens,
            )
    return StepBatch(tuple(made[id(rb)] for rb in batch.ranks), batch.expert_tokens)
