"""rackserve.model.logprobs: log-softmax of the logits, the sampled token's and the top k."""

from __future__ import annotations

import math

import numpy as np

from rackserve.model.logprobs import token_logprob


def test_logprobs_are_a_normalised_log_softmax() -> None:
    logits = np.array([2.0, 1.0, 0.0, -1.0])
    out = token_logprob(logits, 1, top_k=2)
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    assert math.isclose(out.logprob, math.log(probs[1]), rel_tol=1e-9)
    assert [t for t, _ in out.top] == [0, 1]
    assert math.isclose(sum(math.exp(v) for v in (out.top[0][1], out.top[1][1])), probs[0] + probs[1])


def test_top_zero_gives_the_token_alone_and_ties_keep_id_order() -> None:
    out = token_logprob(np.zeros(8, np.float32), 5, top_k=0)
    assert out.top == () and math.isclose(out.logprob, -math.log(8))
    assert [t for t, _ in token_logprob(np.zeros(8, np.float32), 5, top_k=3).top] == [0, 1, 2]
