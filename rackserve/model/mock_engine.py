"""A rank engine that runs the cost model instead of the model: same scheduler, block hashing,
block cache, KV import/export and events as `Engine`, deterministic pseudo-tokens instead of logits.

What differs from the real engine, and only this:
- The model is `PseudoTokens`: the token at position p is a hash of (engine seed, p, the token at
  p - 1), drawn from lowercase letters and space, so it never emits EOS (a request runs to
  max_tokens, as the simulator assumes) and is identical after a P->D hand-off or a preemption.
- The paged KV holds one layer of width 2 (`mock_model_config`), so a rank weighs a few MB.
- Blocks leave the rank (`export_prefix`) as `pool_block_bytes` zero bytes, the target model's KV
  of a block (`block_size` x kv_bytes_per_token), or none; imported blocks must have that size.
Everything the scheduler, the cache and the router see (hits, imports, evictions, events, token
counts) is therefore what the real engine would report on the same requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import xxhash

from rackserve.config import Config
from rackserve.kv.events import Publisher
from rackserve.kv.kv_codec import encode_block
from rackserve.model.config import ModelConfig
from rackserve.model.engine import Admission, Engine
from rackserve.model.engine_request import EngineRequest
from rackserve.model.sampling import SamplingParams
from rackserve.sched.output import SchedulerOutput

# Byte-level token ids of "abcdefghijklmnopqrstuvwxyz ": readable text, never a special token.
PSEUDO_TOKENS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz ", np.uint8).astype(np.int64)
CHOSEN_LOGIT = 1e4  # the pseudo-token's logit over 0 elsewhere: any temperature / top-p picks it


def mock_model_config(model: ModelConfig) -> ModelConfig:
    """The real model's identity (id, seed, block size, vocab, context) with a one-layer, width-2
    KV: block hashes equal the real ranks', a rank's paged KV stays tiny."""
    return replace(model, n_layers=1, head_dim=2, engram_layers=(0, 0))


def pseudo_token(seed: int, position: int, previous: int) -> int:
    """The mock's token at `position`, after `previous`."""
    digest = xxhash.xxh64_intdigest(np.array([position, previous], np.int64).tobytes(), seed)
    return int(PSEUDO_TOKENS[digest % len(PSEUDO_TOKENS)])


class PseudoTokens:
    """Stands in for the Transformer: logits that put all mass on the pseudo-token."""

    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg

    def forward(self, kv: object, ends: Sequence[tuple[int, int]]) -> np.ndarray:
        """`ends`: per sequence, (its last token so far, the position of the token to sample)."""
        logits = np.zeros((len(ends), self.cfg.vocab_size), np.float32)
        for row, (previous, position) in enumerate(ends):
            logits[row, pseudo_token(self.cfg.seed, position, previous)] = CHOSEN_LOGIT
        return logits


class MockEngine(Engine):
    """`Engine` with `PseudoTokens` for a model and target-sized opaque blocks for the pool."""

    def __init__(self, cfg: ModelConfig, num_blocks: int, pool_block_bytes: int, **kwargs: object) -> None:
        super().__init__(cfg, PseudoTokens(cfg), num_blocks, **kwargs)  # type: ignore[arg-type]
        self.pool_block_bytes = pool_block_bytes
        self._pool_block = bytes(pool_block_bytes)
        zeros = np.zeros((cfg.n_layers, cfg.block_size, cfg.head_dim), np.float32)
        self._codec_block = encode_block(zeros, zeros, cfg.fingerprint)

    @classmethod
    def from_deployment(
        cls, config: Config, publisher: Publisher | None = None, **kwargs: object
    ) -> MockEngine:
        """A mock rank shaped by the deployment: the engine section's limits, the timing model's
        KV bytes per token for the pool's values (`pool.mock_bytes`)."""
        from rackserve.timing.spec import load_model  # the target's spec, read once per process

        e = config.engine
        model = mock_model_config(ModelConfig.from_sections(e, config.engram))
        per_token = load_model(config.timing.model).kv_bytes_per_token
        block_bytes = round(e.block_size * per_token) if config.pool.mock_bytes else 0
        return cls(
            model,
            e.cache_blocks_per_rank,
            block_bytes,
            max_num_batched_tokens=e.max_num_batched_tokens,
            max_num_seqs=e.max_num_seqs,
            max_queue=e.max_queue_seqs,
            publisher=publisher,
            **kwargs,
        )

    def export_prefix(self, token_ids: Sequence[int]) -> list[tuple[int, bytes]]:
        return [(h, self._pool_block) for h, _ in super().export_prefix(token_ids)]

    def add_request(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        output_ids: Sequence[int] = (),
        kv_blocks: Sequence[tuple[int, bytes]] = (),
    ) -> Admission:
        if params.prompt_logprobs is not None:
            raise ValueError("prompt_logprobs: the mock engine has no model (engine.kind: real)")
        hashes, blocks = self._chain([*prompt_ids, *output_ids])
        for i, (block_hash, data) in enumerate(kv_blocks):
            cached = i < len(hashes) and self.cache.find(block_hash, blocks[i]) is not None
            if len(data) != self.pool_block_bytes and not cached:  # a cached one is not read
                raise ValueError(
                    f"kv_blocks[{i}]: {len(data)} bytes, a mock block has {self.pool_block_bytes}"
                )
        blocks = [(h, self._codec_block) for h, _ in kv_blocks]
        return super().add_request(request_id, prompt_ids, params, output_ids, blocks)

    def _segments(  # type: ignore[override]
        self, plan: SchedulerOutput, requests: list[EngineRequest]
    ) -> list[tuple[int, int]]:
        """What `PseudoTokens` needs of each scheduled sequence (no Engram rows, no token arrays)."""
        ends = []
        for r, s in zip(requests, plan.seqs, strict=True):
            end = s.num_computed_tokens + s.num_new_tokens
            ends.append((r.token_ids[end - 1], end))
        return ends
