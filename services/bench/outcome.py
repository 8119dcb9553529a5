"""What one benchmark request produced, as seen by the client (wall clock, monotonic seconds)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Outcome:
    """One request's client-side record; `chunk_times` are the wall times streamed text arrived."""

    req_id: int
    prompt_tokens: int
    max_tokens: int
    session: int = -1
    warmup: bool = False  # a cache warm-up turn: left out of the figures
    arrival_s: float = 0.0  # when the workload scheduled it (simulated s from the start)
    start: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    end: float = 0.0
    output_tokens: int = 0
    cached_tokens: int = 0
    success: bool = False
    error: str = ""
    server: dict = field(default_factory=dict)  # the router's `rackserve` timings (simulated s)

    @property
    def overflowed(self) -> bool:
        """The server refused it for its length (OpenAI `context_length_exceeded`)."""
        return "context_length_exceeded" in self.error

    @property
    def ttft_wall(self) -> float | None:
        return self.chunk_times[0] - self.start if self.chunk_times else None

    @property
    def e2e_wall(self) -> float:
        return self.end - self.start

    @property
    def itls_wall(self) -> list[float]:
        t = self.chunk_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    @property
    def tpot_wall(self) -> float | None:
        """Mean time per output token after the first (vLLM's TPOT); None below 2 tokens."""
        if self.ttft_wall is None or self.output_tokens < 2:
            return None
        return (self.e2e_wall - self.ttft_wall) / (self.output_tokens - 1)
