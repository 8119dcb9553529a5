"""Next-token choice: greedy, or temperature + top-p with a per-request seed.

The random draw for the token at position p uses np.random.default_rng([seed, p]) only, so a
request samples the same tokens whatever batch it runs in, and after a P->D hand-off.
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

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not np.isfinite(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")


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
