"""What the front door knows about one finished request (the input of its metrics)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rackserve.metrics.labels import STATUSES


@dataclass(frozen=True)
class RequestRecord:
    """What the front door knows about one finished request, in simulated seconds."""

    status: str
    prompt_cached_tokens: int
    prompt_uncached_tokens: int
    output_tokens: int
    ttft_s: float | None = None
    queue_s: float = 0.0
    prefill_s: float = 0.0
    kv_transfer_s: float = 0.0
    first_decode_s: float = 0.0
    e2e_s: float | None = None
    inter_token_s: Sequence[float] = field(default_factory=tuple)
    # vLLM's meaning of the `engine` label: the engine (RankKey.engine) that served the last token;
    # a migration is counted by rackserve_migrations_total, never spelled into this label.
    decode_engine: str = ""
    # OpenAI's, of a finished request: "stop" (EOS or a stop string) or "length".
    finish_reason: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status: expected one of {STATUSES}, got {self.status!r}")
        if "->" in self.decode_engine:
            raise ValueError(f"decode_engine: one engine, not a path: {self.decode_engine!r}")
        if self.finish_reason not in ("", "stop", "length"):
            raise ValueError(f"finish_reason: expected stop or length, got {self.finish_reason!r}")

    @property
    def finished_reason(self) -> str | None:
        """vLLM's finished_reason label; None for a request refused before any engine saw it. A
        finished request that names no reason ran to its token budget (the router's own default)."""
        if self.status == "finished":
            return self.finish_reason or "length"
        return {"aborted": "abort", "error": "error"}.get(self.status)

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (vLLM's TPOT), None with < 2 tokens."""
        if self.e2e_s is None or self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)
