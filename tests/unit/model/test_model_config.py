"""ModelConfig validation and deterministic weights."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
import xxhash

from rackserve.config import EngineSection, EngramSection
from rackserve.model.config import ModelConfig
from rackserve.model.weights import init_weights


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"d_model": 0}, "d_model"),
        ({"top_k": 9}, "top_k"),
        ({"head_dim": 33}, "head_dim"),
        ({"engram_layers": (1, 7)}, "engram_layers"),
    ],
)
def test_bad_shapes_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig(**kwargs)


def test_weights_are_deterministic_from_the_seed():
    cfg = ModelConfig(n_layers=2, engram_layers=(0, 1), d_model=64, n_experts=4)
    a, b, c = init_weights(cfg), init_weights(cfg), init_weights(cfg, seed=1)
    assert np.array_equal(a.layers[1].experts_w13, b.layers[1].experts_w13)
    assert not np.array_equal(a.layers[1].experts_w13, c.layers[1].experts_w13)
    assert a.layers[0].wq.dtype == np.float32


def test_from_sections_and_fingerprint():
    cfg = ModelConfig.from_sections(
        EngineSection(block_size=32, seed=5), EngramSection(table_rows=1000)
    )
    assert (cfg.block_size, cfg.seed, cfg.engram_rows) == (32, 5, 1000)
    assert (
        cfg.fingerprint
        != ModelConfig.from_sections(EngineSection(block_size=32, seed=6)).fingerprint
    )


def test_fingerprint_ignores_only_max_context():
    assert ModelConfig(max_context=100).fingerprint == ModelConfig().fingerprint
    assert ModelConfig(block_size=32).fingerprint != ModelConfig().fingerprint


def test_fingerprint_is_computed_once_and_travels_with_the_config():
    cfg = ModelConfig(block_size=32)
    want = xxhash.xxh3_64_intdigest(
        repr(sorted((k, v) for k, v in dataclasses.asdict(cfg).items() if k != "max_context")).encode()
    )
    assert "fingerprint" not in vars(cfg)
    assert cfg.fingerprint == want
    assert vars(cfg)["fingerprint"] == want  # kept: every KV block read or written asks for it
    copy = pickle.loads(pickle.dumps(cfg))  # as a Ray actor receives it
    assert copy == cfg and hash(copy) == hash(cfg) and copy.fingerprint == want
