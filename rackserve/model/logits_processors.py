"""What shapes a request's logits before its token is drawn: logit_bias, min_tokens and the
frequency, presence and repetition penalties, in vLLM v1's order and with its formulas.

vLLM's sampler (vllm/v1/sample/sampler.py) applies the logits processors that can change the
argmax (min_tokens, logit_bias) first, then the penalties (vllm/model_executor/layers/utils.py
`apply_penalties`):
- repetition_penalty r (vLLM/HF): a token seen in the prompt or the output has its logit divided
  by r when positive, multiplied by r otherwise (r = 1: off);
- frequency_penalty f, presence_penalty p (OpenAI): logit[j] -= c[j] * f + (c[j] > 0) * p, with
  c[j] the count of token j in the output so far.
Temperature and top-p then act on the result (rackserve/model/sampling.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rackserve.model.sampling import SamplingParams


def process_logits(
    logits: np.ndarray,
    params: SamplingParams,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    eos_ids: Sequence[int],
) -> np.ndarray:
    """The logits (float64, a new array) the next output token is drawn from."""
    out = np.array(logits, np.float64)
    for token, bias in params.logit_bias:
        out[token] += bias
    if len(output_ids) < params.min_tokens:
        out[list(eos_ids)] = -np.inf
    if params.repetition_penalty != 1.0:
        seen = np.zeros(len(out), bool)
        seen[np.asarray([*prompt_ids, *output_ids], np.int64)] = True
        r = params.repetition_penalty
        out[seen] = np.where(out[seen] > 0, out[seen] / r, out[seen] * r)
    if params.frequency_penalty or params.presence_penalty:
        counts = np.bincount(np.asarray(output_ids, np.int64), minlength=len(out))
        out -= counts * params.frequency_penalty + (counts > 0) * params.presence_penalty
    return out
