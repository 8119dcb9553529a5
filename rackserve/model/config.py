"""The small MoE model's shape: one frozen dataclass that every other model module reads.

Sizes mirror DeepSeek-V4.1-Flash's structure (one shared KV head, shared + top-k routed experts,
Engram at two layers) at a scale where a decode step at batch 32 takes a few ms on 2 CPU cores.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import xxhash

from rackserve.model.tokenizer import VOCAB_SIZE


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the small model. Weights are a pure function of (this config, `seed`)."""

    model_id: str = "rackserve-moe-small"
    seed: int = 0
    vocab_size: int = VOCAB_SIZE
    d_model: int = 256
    n_layers: int = 4
    n_q_heads: int = 8
    head_dim: int = 32  # one shared K/V head of this width (as the target's single K=V head)
    n_experts: int = 8
    top_k: int = 2
    expert_hidden: int = 256
    shared_hidden: int = 256
    routed_scale: float = 1.5  # the target's routed scaling factor
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    engram_layers: tuple[int, int] = (1, 3)  # the target uses layers 1 and 14 of 40
    engram_ngrams: tuple[int, ...] = (2, 3, 4)
    engram_heads_per_ngram: int = 2  # the target uses 8
    engram_rows: int = 1 << 16
    engram_dim: int = 32
    block_size: int = 16
    max_context: int = 8192

    def __post_init__(self) -> None:
        positive = (
            "vocab_size",
            "d_model",
            "n_layers",
            "n_q_heads",
            "head_dim",
            "n_experts",
            "top_k",
            "expert_hidden",
            "shared_hidden",
            "engram_heads_per_ngram",
            "engram_rows",
            "engram_dim",
            "block_size",
            "max_context",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) must not exceed n_experts ({self.n_experts})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if len(self.engram_layers) != 2 or not all(
            0 <= i < self.n_layers for i in self.engram_layers
        ):
            raise ValueError(
                f"engram_layers must be two layer indices below n_layers, got {self.engram_layers}"
            )
        if not self.engram_ngrams or min(self.engram_ngrams) < 2:
            raise ValueError(f"engram_ngrams must be n-gram sizes >= 2, got {self.engram_ngrams}")

    @property
    def engram_heads(self) -> int:
        """Rows looked up per token per table: one per (n-gram size, hash head)."""
        return len(self.engram_ngrams) * self.engram_heads_per_ngram

    @functools.cached_property  # every block read or written checks it: computed once (frozen)
    def fingerprint(self) -> int:
        """64-bit id of everything that shapes KV values (all fields but max_context): serialized KV
        carries it so blocks of another model are refused."""
        fields = {k: v for k, v in asdict(self).items() if k != "max_context"}
        return xxhash.xxh3_64_intdigest(repr(sorted(fields.items())).encode())

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.n_layers * self.head_dim * 4

    @classmethod
    def from_sections(cls, engine: object, engram: object | None = None) -> ModelConfig:
        """Build from rackserve.config's EngineSection (and EngramSection for the table size)."""
        extra = {} if engram is None else {"engram_rows": engram.table_rows}
        return cls(
            model_id=engine.model_id,
            seed=engine.seed,
            block_size=engine.block_size,
            max_context=engine.max_context,
            **extra,
        )
