"""How the simulator names a prompt's KV: groups of `group` target blocks plus the prompt's last
partial group, so tracking costs 1/group of the blocks and in-conversation reuse stays exact.

A chained block hash names its whole prefix, so group i is named by the hash of its last block, and
a prompt whose length is not a multiple of the group also stores its last block's hash (the tail).
The next turn of the same conversation extends that prompt: its own group keys miss at the group
holding the old tail, and `refine` finds the tail there by looking up at most group - 1 of its full
block hashes. A hit is therefore as long as with per-block tracking whenever the earlier prompt is
still cached; only evictions act per group.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass

from rackserve.workload.trace_blocks import BlockHashes


@dataclass(frozen=True, slots=True)
class BlockKeys:
    keys: tuple[int, ...]  # group keys, then the tail key when the prompt ends inside a group
    blocks: Sequence[int]  # the prompt's full block hashes (target block size)
    group: int
    n_blocks: int  # len(blocks), read per lookup

    @staticmethod
    def of(blocks: Sequence[int], group: int) -> BlockKeys:
        n = len(blocks)
        # a replayed turn's blocks reuse their predecessor's keys (BlockHashes.group_keys)
        keys = blocks.group_keys(group) if isinstance(blocks, BlockHashes) else tuple(blocks[group - 1 :: group])
        if n % group:  # never with group 1
            keys += (blocks[-1],)
        return BlockKeys(keys, blocks, group, n)

    def blocks_in(self, elements: int) -> int:
        """Blocks covered by the first `elements` keys."""
        n = elements * self.group
        return n if n < self.n_blocks else self.n_blocks

    def element_blocks(self, i: int) -> int:
        return self.blocks_in(i + 1) - self.blocks_in(i)

    def refine(self, elements: int, held: Callable[[Sequence[int]], Container[int]]) -> int:
        """Blocks past the first `elements` keys that are cached too (a shorter prompt's tail inside
        the next group): the longest prefix of that group whose last block is among `held(span)`,
        the cached ones of the group's first group - 1 blocks (one C-level set intersection per
        cache instead of a call per block: most of these blocks are cached nowhere)."""
        start = elements * self.group
        stop = min(start + self.group - 1, self.n_blocks)
        if stop <= start:
            return 0
        span = self.blocks[start:stop]
        found = held(span)
        if not found:
            return 0
        for j in range(len(span) - 1, -1, -1):
            if span[j] in found:
                return j + 1
        return 0
