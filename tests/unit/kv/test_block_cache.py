"""BlockCache: LRU eviction order, reference counts protect blocks, capacity, hit verification, events."""

from __future__ import annotations

import numpy as np
import pytest

from rackserve.kv.block_cache import BlockCache
from rackserve.kv.events import Publisher

BS = 4


def fill(cache: BlockCache, n: int, first_hash: int = 100) -> list[int]:
    """Allocate n blocks, commit them with distinct hashes/tokens, release them (cached, evictable)."""
    blocks = cache.allocate(n)
    for i, b in enumerate(blocks):
        cache.commit(b, first_hash + i, [first_hash + i] * BS, None)
    cache.release(blocks)
    return blocks


def test_lru_evicts_least_recently_released_first():
    cache = BlockCache(4, BS)
    a = fill(cache, 2, first_hash=100)
    b = fill(cache, 2, first_hash=200)
    # Touch the first chain again: it becomes most recently used.
    cache.acquire([cache.find(100, [100] * BS), cache.find(101, [101] * BS)])
    cache.release(a)
    cache.allocate(1)
    # release() queues a chain tail first, so chain b's tail (201) goes before its head (200).
    assert cache.find(201, [201] * BS) is None
    assert cache.find(200, [200] * BS) == b[0]
    assert cache.find(100, [100] * BS) == a[0]


def test_referenced_blocks_are_never_evicted_and_capacity_holds():
    rng = np.random.default_rng(0)
    cache = BlockCache(8, BS)
    held: list[int] = []
    next_hash = 1
    for _ in range(500):
        if held and rng.random() < 0.4:
            cache.release([held.pop(int(rng.integers(len(held))))])
            continue
        if cache.num_free == 0:
            continue
        (block,) = cache.allocate(1)
        assert block not in held, "a referenced block was handed out again"
        cache.commit(block, next_hash, [next_hash] * BS, None)
        next_hash += 1
        held.append(block)
        for b in held:
            assert cache.ref_count(b) == 1 and cache.block_hash(b) is not None
        stats = cache.stats()
        assert stats.num_cached <= cache.num_blocks
        assert stats.num_free + len(held) == cache.num_blocks


def test_allocate_beyond_free_raises():
    cache = BlockCache(2, BS)
    cache.allocate(2)
    with pytest.raises(MemoryError):
        cache.allocate(1)


def test_hit_requires_matching_tokens():
    cache = BlockCache(2, BS)
    fill(cache, 1, first_hash=7)
    assert cache.find(7, [7] * BS) is not None
    assert cache.find(7, [8] * BS) is None  # same hash, other tokens: treated as a collision


def test_match_prefix_stops_at_first_miss():
    cache = BlockCache(4, BS)
    fill(cache, 3, first_hash=10)
    tokens = [[10] * BS, [11] * BS, [99] * BS, [12] * BS]
    assert len(cache.match_prefix([10, 11, 99, 12], tokens)) == 2


def test_duplicate_commit_keeps_first_copy():
    cache = BlockCache(4, BS)
    first = fill(cache, 1, first_hash=5)
    (other,) = cache.allocate(1)
    assert cache.commit(other, 5, [5] * BS, None) is False
    assert cache.find(5, [5] * BS) == first[0]


def test_events_stored_and_removed_with_sequence_numbers():
    seen = []
    cache = BlockCache(2, BS, Publisher("prefill-0", 1), on_event=seen.append)
    fill(cache, 2, first_hash=1)
    cache.allocate(1)  # evicts the LRU cached block
    assert [(e.kind, e.block_hashes, e.tier) for e in seen] == [
        ("stored", (1,), "rank_hbm"),
        ("stored", (2,), "rank_hbm"),
        ("removed", (2,), "rank_hbm"),
    ]
    assert [e.seq for e in seen] == [1, 2, 3]
    assert seen[0].publisher.key == "prefill-0/1"


def test_events_drainable_without_callback():
    cache = BlockCache(2, BS)
    fill(cache, 1)
    assert [e.kind for e in cache.drain_events()] == ["stored"]
    assert cache.drain_events() == []
    cache.clear()
    assert [e.kind for e in cache.drain_events()] == ["removed"]
    assert cache.stats().num_cached == 0
