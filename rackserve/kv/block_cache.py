"""Per-rank KV block cache: block ids, reference counts, prefix reuse by chained hash, LRU eviction.

Blocks with no reference sit in a free queue ordered least-recently-used first (an OrderedDict:
O(1) touch, append and evict, like vLLM v1's free-block queue). A free block may still hold a cached
full block (its hash stays findable) until it is handed out again: that is the eviction, and it
emits a `removed` KVEvent. Committing a full block emits a `stored` KVEvent (tier "rank_hbm").
A referenced block is never in the free queue, so it is never evicted; capacity is the fixed
number of blocks. Events go to `on_event` if given, and are kept for `drain_events()` otherwise.

Eviction is prefix-closed: a prefix is matched from its first block, so when a cached block is
evicted, the cached blocks chained after it (which may sit in other requests' blocks, e.g. after
two requests computed the same first block at once) are forgotten first, tails before parents;
and a block whose parent is not cached is never cached.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rackserve.kv.events import EventSequencer, KVEvent, Publisher

TIER = "rank_hbm"


@dataclass(frozen=True)
class CacheStats:
    num_blocks: int
    num_free: int  # unreferenced blocks (empty or evictable cached)
    num_cached: int  # blocks findable by hash (referenced or not)
    hits: int  # blocks found by lookups that were then used
    queries: int  # blocks asked for by those lookups
    evictions: int

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class BlockCache:
    """Hands out block ids of one rank's paged KV and remembers which full blocks they hold."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        publisher: Publisher | None = None,
        on_event: Callable[[KVEvent], None] | None = None,
    ) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref = np.zeros(num_blocks, np.int64)
        self._hash: list[int | None] = [None] * num_blocks
        self._tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self._by_hash: dict[int, int] = {}
        self._children: dict[int, set[int]] = {}  # cached hash -> cached hashes chained after it
        self._parent: dict[int, int | None] = {}  # cached hash -> its parent hash
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._events = EventSequencer(publisher or Publisher("local"))
        self._on_event = on_event
        self._pending: list[KVEvent] = []
        self._hits = self._queries = self._evictions = 0

    # -- queries ---------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    def stats(self) -> CacheStats:
        return CacheStats(
            self.num_blocks,
            len(self._free),
            len(self._by_hash),
            self._hits,
            self._queries,
            self._evictions,
        )

    def ref_count(self, block_id: int) -> int:
        return int(self._ref[block_id])

    def block_hash(self, block_id: int) -> int | None:
        return self._hash[block_id]

    def find(self, block_hash: int, tokens: Sequence[int]) -> int | None:
        """Block id caching `block_hash` with exactly `tokens` (a hash collision is a miss)."""
        block = self._by_hash.get(block_hash)
        if block is None or self._tokens[block] != tuple(tokens):
            return None
        return block

    def match_prefix(
        self, hashes: Sequence[int], token_blocks: Sequence[Sequence[int]]
    ) -> list[int]:
        """Block ids of the longest cached prefix of a chain (no side effects)."""
        found: list[int] = []
        for block_hash, tokens in zip(hashes, token_blocks, strict=True):
            block = self.find(block_hash, tokens)
            if block is None:
                break
            found.append(block)
        return found

    def record_lookup(self, queried: int, hit: int) -> None:
        """Count a prefix lookup that a request acted on (for hit-rate statistics)."""
        self._queries += queried
        self._hits += hit

    # -- reference counting ----------------------------------------------------------------
    def acquire(self, block_ids: Sequence[int]) -> None:
        """Reference blocks (e.g. a prefix hit): they leave the free queue and cannot be evicted."""
        for block in block_ids:
            if self._ref[block] == 0:
                del self._free[block]
            self._ref[block] += 1

    def allocate(self, n: int) -> list[int]:
        """n fresh blocks with one reference each, evicting least-recently-used cached blocks."""
        if n > len(self._free):
            raise MemoryError(f"need {n} KV blocks, only {len(self._free)} free")
        blocks = []
        for _ in range(n):
            block, _ = self._free.popitem(last=False)
            self._evict(block)
            self._ref[block] = 1
            blocks.append(block)
        return blocks

    def release(self, block_ids: Sequence[int]) -> None:
        """Drop one reference per block. Pass a request's blocks in order: they are queued tail
        first, so a sequence's last blocks are evicted before its (more shared) first ones."""
        for block in reversed(block_ids):
            assert self._ref[block] > 0, f"block {block} released more often than acquired"
            self._ref[block] -= 1
            if self._ref[block] == 0:
                self._free[block] = None

    # -- content ----------------------------------------------------------------------------
    def commit(
        self, block_id: int, block_hash: int, tokens: Sequence[int], parent: int | None
    ) -> bool:
        """Mark a referenced, full block as caching `block_hash`. Returns False (and caches nothing)
        when another block already caches that hash (the first copy stays the findable one) or
        when its parent is not cached (nothing could reach it)."""
        assert self._ref[block_id] > 0, "only a referenced block can be committed"
        assert len(tokens) == self.block_size, "only full blocks are cached"
        if block_hash in self._by_hash or self._hash[block_id] is not None:
            return False
        if parent is not None and parent not in self._by_hash:
            return False
        self._hash[block_id] = block_hash
        self._tokens[block_id] = tuple(int(t) for t in tokens)
        self._by_hash[block_hash] = block_id
        self._parent[block_hash] = parent
        if parent is not None:
            self._children.setdefault(parent, set()).add(block_hash)
        self._emit(self._events.make("stored", TIER, (block_hash,), parent))
        return True

    def clear(self) -> None:
        """Forget every unreferenced cached block (e.g. on a model reload)."""
        for block in list(self._free):
            self._evict(block)

    def drain_events(self) -> list[KVEvent]:
        """Events not delivered to `on_event`, oldest first; the list is emptied."""
        events, self._pending = self._pending, []
        return events

    def _evict(self, block: int) -> None:
        block_hash = self._hash[block]
        if block_hash is None:
            return
        for child in sorted(self._children.pop(block_hash, ())):  # tails go first
            self._evict(self._by_hash[child])
        siblings = self._children.get(self._parent.pop(block_hash))  # type: ignore[arg-type]
        if siblings is not None:
            siblings.discard(block_hash)
        del self._by_hash[block_hash]
        self._hash[block] = None
        self._tokens[block] = None
        self._evictions += 1
        self._emit(self._events.make("removed", TIER, (block_hash,)))

    def _emit(self, event: KVEvent) -> None:
        if self._on_event is not None:
            self._on_event(event)
        else:
            self._pending.append(event)
