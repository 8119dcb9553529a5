"""One request's sampling settings and its trip record: where it went, its simulated latencies."""

from __future__ import annotations

from dataclasses import dataclass, field

from rackserve.model.logprobs import TokenLogprob


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    ignore_eos: bool = False
    top_logprobs: int | None = None  # alternatives per token's logprob; None: no logprobs
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    prompt_logprobs: int | None = None  # the prompt's logprobs too (echo), with these alternatives
    prompt_tokens: int = 0  # a migrated request: its own prompt's length (the rest it sent)


@dataclass
class Trip:
    """Where a request went and its latencies in simulated seconds (filled while it runs)."""

    request_id: str
    prompt_tokens: int
    prefill: str = ""
    decode: str = ""
    predicted_hit_tokens: int = 0
    local_hit_tokens: int = 0
    pool_hit_tokens: int = 0
    queue_s: float = 0.0
    prefill_s: float = 0.0
    kv_transfer_s: float = 0.0
    first_decode_s: float = 0.0
    decode_s: float = 0.0  # sim time from joining the decode rank to the last token
    pacing_lag_s: float = 0.0
    completion_tokens: int = 0
    finish_reason: str = ""
    token_times_s: list[float] = field(default_factory=list)  # sim time of each token from arrival
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob | None] = field(default_factory=list)  # one per output id, if asked
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)  # first is None

    @property
    def last_decode(self) -> str:
        """The decode engine ("instance/rank") that served the last token; `decode` keeps the
        whole path of a migrated request ("a/0->b/1")."""
        return self.decode.rsplit("->", 1)[-1]

    @property
    def cached_tokens(self) -> int:
        return self.local_hit_tokens + self.pool_hit_tokens

    @property
    def ttft_s(self) -> float:
        return self.queue_s + self.prefill_s + self.kv_transfer_s + self.first_decode_s

    @property
    def e2e_s(self) -> float:
        return self.token_times_s[-1] if self.token_times_s else self.ttft_s

    @property
    def tpot_s(self) -> float:
        n = len(self.token_times_s)
        return (self.e2e_s - self.ttft_s) / (n - 1) if n > 1 else 0.0
