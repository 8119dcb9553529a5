"""The state of one request inside an engine: tokens, computed-token counter, blocks, hashes.

A request is a counter, not a phase: `num_computed` catches up to `len(token_ids)`. When it does,
a token is sampled and appended. Prefill, chunked prefill, prefix hits and a P->D hand-off are all
just different starting values and step sizes of that counter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rackserve.kv.block_hash import hash_block
from rackserve.model.sampling import SamplingParams


@dataclass
class EngineRequest:
    request_id: str
    token_ids: list[int]  # prompt, then outputs
    num_prompt_tokens: int
    params: SamplingParams
    seed: int
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # of committed full blocks, chained
    num_computed: int = 0  # tokens whose KV is in block_ids
    num_cached: int = 0  # tokens reused from the cache at admission (not computed here)
    finish_reason: str | None = None

    @property
    def num_pending(self) -> int:
        return len(self.token_ids) - self.num_computed

    @property
    def num_outputs(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_decoding(self) -> bool:
        return self.num_pending == 1 and self.num_outputs > 0

    def blocks_needed(self, num_new: int, block_size: int) -> int:
        """Extra blocks to hold KV of `num_new` more tokens."""
        total = -(-(self.num_computed + num_new) // block_size)
        return max(0, total - len(self.block_ids))

    def next_full_blocks(self, block_size: int, root: int) -> list[tuple[int, int, int, list[int]]]:
        """(block index, hash, parent hash or None for the first block, tokens) of blocks that became
        full of computed KV and are not hashed yet; extends `block_hashes`."""
        out = []
        while (len(self.block_hashes) + 1) * block_size <= self.num_computed:
            i = len(self.block_hashes)
            tokens = self.token_ids[i * block_size : (i + 1) * block_size]
            parent = self.block_hashes[-1] if self.block_hashes else root
            block_hash = hash_block(parent, tokens)
            self.block_hashes.append(block_hash)
            out.append((i, block_hash, parent if i else None, tokens))
        return out
