"""The engine's record of one request: its tokens, sampling settings and outcome.

The scheduler keeps the request's counters (rackserve.sched.SeqState: tokens known vs computed) and
the KV ledger its blocks; this record holds what only the engine needs: the token ids themselves
(prompt, then outputs), the sampling parameters and seed, the prompt's logits when asked, and why
it finished.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rackserve.model.sampling import SamplingParams
from rackserve.sched.seq_state import SeqState


@dataclass(eq=False)
class EngineRequest:
    request_id: str
    token_ids: list[int]  # prompt, then outputs
    num_prompt_tokens: int
    params: SamplingParams
    seed: int
    seq: SeqState  # the scheduler's counters of this request
    num_cached: int | None = None  # tokens reused from the cache when it first started
    finish_reason: str | None = None
    # [prompt tokens, vocab] float32 filled as the prompt is computed, when prompt_logprobs is asked
    prompt_logits: np.ndarray | None = field(default=None, repr=False)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_computed(self) -> int:
        return self.seq.computed_tokens

    @property
    def num_outputs(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_decoding(self) -> bool:
        return self.seq.started and self.seq.pending == 1 and self.num_outputs > 0
