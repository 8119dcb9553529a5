"""The scheduler's state of one request on one rank: counters, not phases (vLLM v1 style).

`computed_tokens` (KV held) catches up to `num_tokens` (tokens known: the admitted tokens plus those
sampled here). A step computes `pending` tokens or a chunk of them; when it catches up, one token is
sampled (`generated` += 1). Prefill, chunked prefill, prefix hits, a P->D hand-off and recompute
after preemption are all different starting values and step sizes of these two counters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(eq=False)
class SeqState:
    req_id: int | str
    prompt_tokens: int  # tokens known at admission: the prompt, plus any outputs already given
    output_tokens: int  # tokens this rank samples at most (the request ends after them)
    computed_tokens: int = 0  # tokens whose KV this rank holds (delivered KV counts from the start)
    generated: int = 0  # tokens sampled on this rank
    pool_hbm_tokens: int = (
        0  # prompt tokens to fetch from the pool's spare-HBM tier on the first step
    )
    pool_dram_tokens: int = 0  # ... and from its DRAM tier
    payload: Any = None  # the owner's handle (the simulator's request record)
    delivered_tokens: int = 0  # KV that came with it (e.g. a P->D transfer); lost on preemption
    preemptions: int = 0  # times this sequence lost its KV and went back to waiting
    started: bool = False  # looked up its cached prefix and joined the running set
    reuse_prefix: bool = True  # False: computes every token (vLLM's skip_reading_prefix_cache)

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def pending(self) -> int:
        """Tokens known but not yet in KV: what the next step(s) must compute (num_tokens less
        computed_tokens, without a second property call: the schedulers read it per sequence and step)."""
        return self.prompt_tokens + self.generated - self.computed_tokens

    @property
    def prefill_left(self) -> int:
        return max(0, self.prompt_tokens - self.computed_tokens)

    @property
    def decode_left(self) -> int:
        return self.output_tokens - self.generated

    @property
    def context_tokens(self) -> int:
        return self.computed_tokens
