"""The scheduler's view of one rank's KV blocks: which blocks each sequence holds, prefix reuse.

A thin layer over rackserve.kv.BlockCache (ref counts, LRU free queue, reuse by chained hash), so
the live engine and the simulator account blocks by the same code. What differs is only where a
block's identity comes from (`BlockIdentity`): the engine hashes the real tokens; the simulator
(which has no tokens) names blocks by (request, index), so a preempted sequence finds its own
surviving blocks again when it resumes, exactly as the engine does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import xxhash

from rackserve.kv.block_cache import BlockCache
from rackserve.sched.seq_state import SeqState


class BlockIdentity(Protocol):
    def block(self, seq: SeqState, index: int, parent: int | None) -> tuple[int, Sequence[int]]:
        """(chained hash, tokens) of full block `index` of `seq`; `parent` is None for block 0."""
        ...


class SyntheticIdentity:
    """Block ids for a simulator without tokens: unique per (request, block index)."""

    def __init__(self, block_size: int) -> None:
        self._tokens = (0,) * block_size

    def block(self, seq: SeqState, index: int, parent: int | None) -> tuple[int, Sequence[int]]:
        key = f"{seq.req_id}/{index}/{parent or 0}".encode()
        return xxhash.xxh3_64_intdigest(key), self._tokens


class KVLedger:
    """Blocks per sequence on one rank. `lookup` is pure; `allocate` either makes room for a
    step's tokens (acquiring a looked-up prefix first) or changes nothing and returns None."""

    def __init__(self, cache: BlockCache, identity: BlockIdentity) -> None:
        self.cache = cache
        self.identity = identity
        self.block_size = cache.block_size
        self._blocks: dict[int | str, list[int]] = {}
        self._hashes: dict[int | str, list[int]] = {}  # chain of the committed leading blocks
        self._hit: dict[int | str, tuple[list[int], list[int]]] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.cache.num_free

    def block_ids(self, req_id: int | str) -> list[int]:
        return self._blocks.get(req_id, [])

    def lookup(self, seq: SeqState) -> int:
        """Tokens of `seq`'s longest cached prefix (whole blocks), capped so at least its last known
        token is computed. Remembered for the `allocate` that follows."""
        assert seq.req_id not in self._blocks, "lookup is for a sequence that holds no blocks"
        cap = (seq.num_tokens - 1) // self.block_size if seq.reuse_prefix else 0
        blocks: list[int] = []
        hashes: list[int] = []
        for i in range(cap):
            block_hash, tokens = self.identity.block(seq, i, hashes[-1] if hashes else None)
            found = self.cache.find(block_hash, tokens)
            if found is None:
                break
            blocks.append(found)
            hashes.append(block_hash)
        self._hit[seq.req_id] = (blocks, hashes)
        return len(blocks) * self.block_size

    def allocate(self, seq: SeqState, num_new_tokens: int) -> int | None:
        """Blocks newly taken from the free queue for `num_new_tokens` more tokens, or None."""
        held = self._blocks.get(seq.req_id)
        hit_blocks, hit_hashes = self._hit.pop(seq.req_id, ([], [])) if held is None else ([], [])
        have = len(held) if held is not None else len(hit_blocks)
        total = -(-(seq.computed_tokens + num_new_tokens) // self.block_size)
        fresh = max(0, total - have)
        revived = sum(1 for b in hit_blocks if self.cache.ref_count(b) == 0)
        if fresh + revived > self.cache.num_free:
            return None
        if held is None:
            self.cache.acquire(hit_blocks)
            self.cache.record_lookup(seq.num_tokens // self.block_size, len(hit_blocks))
            held = self._blocks[seq.req_id] = list(hit_blocks)
            self._hashes[seq.req_id] = list(hit_hashes)
        held += self.cache.allocate(fresh)
        return fresh + revived

    def commit_full(self, seq: SeqState) -> None:
        """Cache the blocks that became full of computed KV (after a step)."""
        blocks, hashes = self._blocks[seq.req_id], self._hashes[seq.req_id]
        while (len(hashes) + 1) * self.block_size <= seq.computed_tokens:
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            block_hash, tokens = self.identity.block(seq, i, parent)
            self.cache.commit(blocks[i], block_hash, tokens, parent)
            hashes.append(block_hash)

    def free(self, seq: SeqState) -> int:
        """Release every block of `seq` (full ones stay cached until evicted); returns how many."""
        self._hit.pop(seq.req_id, None)
        self._hashes.pop(seq.req_id, None)
        blocks = self._blocks.pop(seq.req_id, [])
        self.cache.release(blocks)
        return len(blocks)
