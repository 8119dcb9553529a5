"""The scheduler's state of one request on one rank: counters, not phases.

computed_tokens catches up to prompt_tokens (prefill, in chunks; a prefix hit starts it above 0),
then grows by one per decode step while `generated` catches up to output_tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(eq=False)
class SeqState:
    req_id: int
    prompt_tokens: int
    output_tokens: int
    computed_tokens: int = 0
    generated: int = 0
    pool_hbm_tokens: int = 0  # prompt tokens to fetch from the pool's spare-HBM tier on the first chunk
    pool_dram_tokens: int = 0  # ... and from its DRAM tier
    payload: Any = None  # the owner's handle (the simulator's request record)

    @property
    def prefill_left(self) -> int:
        return max(0, self.prompt_tokens - self.computed_tokens)

    @property
    def decode_left(self) -> int:
        return self.output_tokens - self.generated

    @property
    def context_tokens(self) -> int:
        return self.computed_tokens
