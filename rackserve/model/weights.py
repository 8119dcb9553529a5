"""Deterministic float32 weights of the small MoE model, a pure function of (config, seed)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rackserve.model.config import ModelConfig

PRINTABLE = np.frombuffer(b" etaoinshrdlucmfwypvbgk.,ETAOINSHRDLU", np.uint8)
PRINTABLE_BIAS = np.float32(8.0)


@dataclass(frozen=True)
class EngramWeights:
    """Gated projection of the looked-up rows: key decides the gate, value is what is added."""

    w_key: np.ndarray  # [H * D, d_model]
    w_value: np.ndarray  # [H * D, d_model]


@dataclass(frozen=True)
class LayerWeights:
    attn_norm: np.ndarray  # [d]
    wq: np.ndarray  # [d, n_q_heads * head_dim]
    wkv: np.ndarray  # [d, 2 * head_dim]: the one shared K head, then the one V head
    wo: np.ndarray  # [n_q_heads * head_dim, d]
    ffn_norm: np.ndarray  # [d]
    router: np.ndarray  # [d, n_experts]
    shared_w13: np.ndarray  # [d, 2 * shared_hidden]: gate | up
    shared_w2: np.ndarray  # [shared_hidden, d]
    experts_w13: np.ndarray  # [n_experts, d, 2 * expert_hidden]
    experts_w2: np.ndarray  # [n_experts, expert_hidden, d]
    engram: EngramWeights | None


@dataclass(frozen=True)
class ModelWeights:
    embed: np.ndarray  # [vocab, d]
    layers: tuple[LayerWeights, ...]
    final_norm: np.ndarray  # [d]
    lm_head: np.ndarray  # [d, vocab]
    lm_bias: np.ndarray  # [vocab]: a prior toward printable text, so random weights read as text


def _normal(
    rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, gain: float = 1.0
) -> np.ndarray:
    w = rng.standard_normal(shape, dtype=np.float32)
    w *= np.float32(gain / np.sqrt(fan_in))
    return w


def _layer(cfg: ModelConfig, rng: np.random.Generator, index: int) -> LayerWeights:
    d, hd, e = cfg.d_model, cfg.head_dim, cfg.n_experts
    engram = None
    if index in cfg.engram_layers:
        width = cfg.engram_heads * cfg.engram_dim
        engram = EngramWeights(
            _normal(rng, (width, d), width), _normal(rng, (width, d), width, 0.5)
        )
    return LayerWeights(
        attn_norm=np.ones(d, np.float32),
        wq=_normal(rng, (d, cfg.n_q_heads * hd), d),
        wkv=_normal(rng, (d, 2 * hd), d),
        wo=_normal(rng, (cfg.n_q_heads * hd, d), cfg.n_q_heads * hd, 0.5),
        ffn_norm=np.ones(d, np.float32),
        router=_normal(rng, (d, e), d, 2.0),
        shared_w13=_normal(rng, (d, 2 * cfg.shared_hidden), d),
        shared_w2=_normal(rng, (cfg.shared_hidden, d), cfg.shared_hidden, 0.5),
        experts_w13=_normal(rng, (e, d, 2 * cfg.expert_hidden), d),
        experts_w2=_normal(rng, (e, cfg.expert_hidden, d), cfg.expert_hidden, 0.5),
        engram=engram,
    )


def init_weights(cfg: ModelConfig, seed: int | None = None) -> ModelWeights:
    """Weights from `seed` (default cfg.seed): same seed, same bytes, on every machine."""
    rng = np.random.default_rng(cfg.seed if seed is None else seed)
    embed = rng.standard_normal((cfg.vocab_size, cfg.d_model), dtype=np.float32)
    layers = tuple(_layer(cfg, rng, i) for i in range(cfg.n_layers))
    # A larger head gain gives peaked next-token distributions, so greedy choices have clear margins.
    lm_head = _normal(rng, (cfg.d_model, cfg.vocab_size), cfg.d_model, 4.0)
    lm_bias = np.zeros(cfg.vocab_size, np.float32)
    lm_bias[PRINTABLE] = PRINTABLE_BIAS
    return ModelWeights(embed, layers, np.ones(cfg.d_model, np.float32), lm_head, lm_bias)
