"""Next-token choice: greedy, or temperature + top-p with a per-request seed.

The random draw for the token at position p uses np.random.default_rng([seed, p]) only, so a
request samples the same tokens whatever batch it runs in, and after a P->D hand-off. The logits
are shaped first (logit_bias, min_tokens, penalties: rackserve/model/logits_processors.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens; invalid values raise ValueError naming the parameter."""

    max_tokens: int = 16
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None  # None: derived from the request id (see Engine.add_request)
    ignore_eos: bool = False
    # What shapes the logits before the draw (rackserve/model/logits_processors.py)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    min_tokens: int = 0  # EOS is banned until this many outputs
    frequency_penalty: float = 0.0  # OpenAI's: minus this times the token's output count
    presence_penalty: float = 0.0  # OpenAI's: minus this once the token is in the output
    repetition_penalty: float = 1.0  # vLLM's: seen tokens' logits divided (>0) or multiplied
    prompt_logprobs: int | None = None  # the prompt's logits kept, with this many alternatives

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not np.isfinite(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        self._check_shaping()

    def _check_shaping(self) -> None:
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not np.isfinite(value) or not -2 <= value <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {value!r}")
        if not np.isfinite(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        for token, bias in self.logit_bias:
            if not isinstance(token, int) or token < 0 or not np.isfinite(bias):
                raise ValueError(f"logit_bias: bad entry {token!r}: {bias!r}")
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            raise ValueError(f"prompt_logprobs must be >= 0, got {self.prompt_logprobs!r}")

    @property
    def shapes_logits(self) -> bool:
        """Whether any of logit_bias, min_tokens or the penalties changes the logits."""
        return bool(
            self.logit_bias
            or self.min_tokens
            or self.frequency_penalty
            or self.presence_penalty
            or self.repetition_penalty != 1.0
        )


def probabilities(logits: np.ndarray, temperature: float, top_p: float) -> np.ndarray:
    """The distribution tokens are drawn from (float64), after temperature and top-p."""
    z = np.asarray(logits, np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p >= 1.0:
        return p
    order = np.argsort(-p, kind="stable")
    before = np.cumsum(p[order]) - p[order]  # mass strictly above each token
    kept = order[before < top_p]  # smallest prefix whose mass reaches top_p
    out = np.zeros_like(p)
    out[kept] = p[kept] / p[kept].sum()
    return out


def sample(logits: np.ndarray, params: SamplingParams, seed: int, position: int) -> int:
    """Token for `position` (index it will have in the sequence) from that position's logits."""
    if params.temperature == 0:
        return int(np.argmax(logits))
    p = probabilities(logits, params.temperature, params.top_p)
    draw = np.random.default_rng([seed, position]).random()
    token = int(np.searchsorted(np.cumsum(p), draw * p.sum(), side="right"))
    return min(token, len(p) - 1)
