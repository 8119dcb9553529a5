"""Sampling: greedy, temperature/top-p distributions, per-(seed, position) reproducibility, validation."""

from __future__ import annotations

import numpy as np
import pytest

from rackserve.model.sampling import SamplingParams, probabilities, sample

LOGITS = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))


def test_greedy_is_argmax():
    assert sample(LOGITS, SamplingParams(temperature=0.0), seed=1, position=5) == 0


def test_top_p_keeps_smallest_set_reaching_mass():
    p = probabilities(LOGITS, 1.0, 0.7)
    np.testing.assert_allclose(p, [0.5 / 0.8, 0.3 / 0.8, 0, 0], rtol=1e-6)
    np.testing.assert_allclose(probabilities(LOGITS, 1.0, 1.0), [0.5, 0.3, 0.15, 0.05], rtol=1e-6)
    assert probabilities(LOGITS, 1.0, 0.01)[0] == 1.0


def test_samples_follow_the_distribution_and_are_reproducible():
    params = SamplingParams(temperature=1.0, top_p=0.7)
    draws = [sample(LOGITS, params, seed=7, position=i) for i in range(1000)]
    assert set(draws) == {0, 1}
    assert abs(np.mean(np.array(draws) == 0) - 0.625) < 0.06  # 4 standard deviations at n=1000
    assert draws == [sample(LOGITS, params, seed=7, position=i) for i in range(1000)]
    assert draws != [sample(LOGITS, params, seed=8, position=i) for i in range(1000)]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_parameters_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)
