"""A sampled token's log-probability under the model, and the most likely tokens at its position
(OpenAI's `logprobs` / `top_logprobs`, from the logits the token was drawn from).

As vLLM reports them by default, these are the model's own distribution (a log-softmax of the raw
logits), before temperature and top-p shape the draw.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_TOP_LOGPROBS = 20  # vLLM's default max_logprobs


@dataclass(frozen=True)
class TokenLogprob:
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), most likely first


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, np.float64)
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def token_logprob(logits: np.ndarray, token: int, top_k: int) -> TokenLogprob:
    """`token`'s logprob at a position whose logits are `logits`, with the `top_k` most likely."""
    assert 0 <= top_k <= MAX_TOP_LOGPROBS, top_k
    lp = log_softmax(logits)
    order = np.argsort(-lp, kind="stable")[:top_k]
    return TokenLogprob(float(lp[token]), tuple((int(t), float(lp[t])) for t in order))
