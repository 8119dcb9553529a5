"""Prefix-closed eviction, as an invariant under random insert / lookup / evict sequences: in the
pool (PoolTiers), the rank's block cache (BlockCache) and the simulator's KV (ClusterKV), a block is
never held while its parent is gone, since nothing can reach it (a prefix is matched from its
first block). A tail goes before its parent."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rackserve.kv.block_cache import BlockCache
from rackserve.kv.events import KVEvent, Publisher
from rackserve.kv.pool_tiers import BlockPut, PoolLimits, PoolTiers
from rackserve.routing.index import PrefixIndex
from rackserve.sim.block_keys import BlockKeys
from rackserve.sim.kv import ClusterKV

BLOCK = 100
EXAMPLES = 200  # examples per property (2000 pass too: about 40 s)
BLOCK_TOKENS = 4
# A prompt is a path in a small tree of blocks (branching 3, depth up to 5): prompts share prefixes.
paths = st.lists(st.integers(0, 2), min_size=1, max_size=5).map(tuple)


def chain(path: tuple[int, ...]) -> list[int]:
    """Block hashes of a path's prefixes: equal prefixes, equal hashes (a chained hash)."""
    return [hash(("block", path[: i + 1])) & (2**63 - 1) for i in range(len(path))]


def tokens(path: tuple[int, ...]) -> list[list[int]]:
    return [[i * 10 + step] * BLOCK_TOKENS for i, step in enumerate(path)]


def every_prefix(seen: set[tuple[int, ...]]) -> set[tuple[int, ...]]:
    return {p[: i + 1] for p in seen for i in range(len(p))}


def assert_prefix_closed(held, seen: set[tuple[int, ...]]) -> None:
    """`held(path)`: is the block at `path` held? Then so is the block at its parent path."""
    for path in every_prefix(seen):
        if len(path) > 1 and held(path):
            assert held(path[:-1]), f"block {path} is held but its parent {path[:-1]} is gone"


# ---- the pool --------------------------------------------------------------------------------
pool_ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), paths, st.booleans()),  # bool: commit only part of the written
        st.tuples(st.just("lookup"), paths, st.integers(0, 4), st.booleans()),  # start, lease
        st.tuples(st.just("release"), st.integers(0, 20)),
        st.tuples(st.just("remove"), paths),
        st.tuples(st.just("wait"), st.floats(0.1, 3.0)),
    ),
    max_size=60,
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(pool_ops, st.integers(2, 6), st.integers(0, 6))
def test_pool_eviction_is_prefix_closed(ops, hbm_blocks, dram_blocks) -> None:
    limits = PoolLimits(hbm_blocks * BLOCK, dram_blocks * BLOCK, 100 * BLOCK,
                        high_watermark=0.9, low_watermark=0.5, lease_s=2.0)
    pool, now, leases, seen = PoolTiers(limits), 0.0, [], set()
    for op in ops:
        now += 0.01
        if op[0] == "put":
            _, path, partial = op
            seen.add(path)
            res = pool.reserve([BlockPut(h, BLOCK) for h in chain(path)], "w", now)
            written = [chain(path)[i] for i in res.to_write]
            pool.commit(res.txn, now, written[::2] if partial else written)
        elif op[0] == "lookup":
            _, path, start, lease = op
            seen.add(path)
            leases.append(pool.lookup(chain(path)[start:], now, lease=lease).lease_id)
        elif op[0] == "release" and leases:
            pool.release(leases[op[1] % len(leases)])
        elif op[0] == "remove":
            pool.remove(chain(op[1])[-1:])
        elif op[0] == "wait":
            now += op[1]
        assert_prefix_closed(lambda p: pool.tier_of(chain(p)[-1]) is not None, seen)
        assert_prefix_closed(lambda p: pool.tier_of(chain(p)[-1]) == "pool_hbm", seen)
    pool.expire(now + 10.0)  # every reservation and lease is over: the books balance
    usage = [pool.usage(tier) for tier in ("pool_hbm", "pool_dram")]
    assert [u.reserved_target_bytes for u in usage] == [0, 0]
    assert pool.actual_bytes == sum(u.bytes for u in usage) and pool.active_leases == 0


def test_pool_probe_a_chain_looked_up_again_matches_its_blocks() -> None:
    """The probe of issue 17: fill a small tier past its watermark with a few chains, look the
    first one up. The old LRU evicted its head first: it matched 0 blocks while its tail still
    occupied DRAM."""
    pool = PoolTiers(PoolLimits(4 * BLOCK, 2 * BLOCK, 100 * BLOCK, 0.9, 0.5))
    chains = [chain((c,) * 3) for c in range(2)]
    for t, hashes in enumerate(chains):
        pool.store([BlockPut(h, BLOCK) for h in hashes], "w", float(t))
    held = [pool.tier_of(h) is not None for h in chains[0]]
    assert held == sorted(held, reverse=True), held  # a prefix of the chain, never a gap
    assert any(held) and pool.match_prefix(chains[0], 4.0).count == sum(held)


# ---- the rank's block cache ------------------------------------------------------------------
cache_ops = st.lists(
    st.one_of(
        st.tuples(st.just("start"), paths),  # a request admits: prefix hit + fresh blocks
        st.tuples(st.just("finish"), st.integers(0, 20)),  # it computed and commits, then frees
        st.tuples(st.just("clear")),
    ),
    max_size=60,
)


# two requests compute the same first block at once: the second copy is not cached, but its next
# block is, under the first copy's hash; evicting that first copy must not leave it reachable-less
RACE = [("start", (0,)), ("start", (0, 1)), ("finish", 0), ("finish", 0), ("start", (2,)),
        ("start", (1,))]


@settings(max_examples=EXAMPLES, deadline=None)
@example(RACE, 4)
@given(cache_ops, st.integers(4, 10))
def test_block_cache_eviction_is_prefix_closed(ops, num_blocks) -> None:
    cache = BlockCache(num_blocks, BLOCK_TOKENS)
    running: list[tuple[tuple[int, ...], list[int], int]] = []  # path, blocks, hits
    seen: set[tuple[int, ...]] = set()
    for op in ops:
        if op[0] == "start":
            path = op[1]
            seen.add(path)
            hashes, toks = chain(path), tokens(path)
            hit = cache.match_prefix(hashes, toks)
            cache.acquire(hit)
            if len(path) - len(hit) > cache.num_free:
                cache.release(hit)  # no room: the request waits
                continue
            running.append((path, hit + cache.allocate(len(path) - len(hit)), len(hit)))
        elif op[0] == "finish" and running:
            path, blocks, hits = running.pop(op[1] % len(running))
            hashes, toks = chain(path), tokens(path)
            for i in range(hits, len(path)):
                cache.commit(blocks[i], hashes[i], toks[i], hashes[i - 1] if i else None)
            cache.release(blocks)
        elif op[0] == "clear":
            cache.clear()
        assert_prefix_closed(lambda p: cache.find(chain(p)[-1], tokens(p)[-1]) is not None, seen)


# ---- the simulator's KV ----------------------------------------------------------------------
sim_ops = st.lists(st.tuples(st.integers(0, 1), paths), max_size=60)


@settings(max_examples=EXAMPLES, deadline=None)
@given(sim_ops, st.integers(2, 6), st.integers(2, 6))
def test_simulator_kv_is_prefix_closed(ops, cache_blocks, pool_blocks) -> None:
    ranks = [("prefill-0", 0), ("prefill-0", 1)]
    limits = PoolLimits(pool_blocks * BLOCK, pool_blocks * BLOCK, 100 * BLOCK, 0.9, 0.5, 1e18)
    kv = ClusterKV(dict.fromkeys(ranks, cache_blocks), limits, BLOCK_TOKENS, BLOCK, PrefixIndex())
    seen: set[tuple[int, ...]] = set()
    for t, (rank, path) in enumerate(ops):
        seen.add(path)
        keys = BlockKeys.of(chain(path), 1)
        hit, _ = kv.delivered_hit(ranks[rank], keys, len(path) * BLOCK_TOKENS + 1, float(t))
        kv.store(ranks[rank], keys, hit.rank_hbm + hit.pool_hbm + hit.pool_dram, float(t))
        for key in ranks:
            cache = kv.caches[key]
            assert_prefix_closed(lambda p, c=cache: c.match(chain(p)[-1:]) == 1, seen)
        assert_prefix_closed(lambda p: kv.pool.tier_of(chain(p)[-1]) is not None, seen)


class _Tapped(ClusterKV):
    """The simulator's KV that also feeds its pool's events to a general and a closed_chains index
    (what the router's index held before it delegated its lookups to the caches and the pool)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.general, self.closed = PrefixIndex(), PrefixIndex(closed_chains=True)

    def _publish_pool(self, i: int = 0) -> None:
        pool = self.pools[i]
        drain = pool.drain

        def tapped():
            events, dropped = drain()
            self.general.apply_all(events)
            self.closed.apply_all(events)
            return events, dropped

        pool.drain = tapped
        try:
            super()._publish_pool(i)
        finally:
            del pool.drain


def _held_run(lru, hashes) -> int:
    """Leading hashes a rank's LRU holds, by walking (the reference for its bisection)."""
    n = 0
    while n < len(hashes) and hashes[n] in lru:
        n += 1
    return n


@settings(max_examples=EXAMPLES, deadline=None)
@given(sim_ops, st.integers(2, 6), st.integers(2, 6), st.integers(1, 2))
def test_delegated_lookups_equal_an_index_fed_every_event_on_simulator_kv(ops, cache_blocks, pool_blocks, group) -> None:
    """The simulator's router index delegates its lookups (rank caches and pool bisect their own
    chains). On the simulator's own KV (rank evictions, pool demotions and drops) its answers equal
    a general index's and a closed_chains index's fed with every pool event, with each rank's
    prefix its leading held run found by walking; the general index stays prefix-closed, so the
    closed_chains promise holds and both hold the same blocks."""
    ranks = [("prefill-0", 0), ("prefill-0", 1)]
    limits = PoolLimits(pool_blocks * BLOCK, pool_blocks * BLOCK, 100 * BLOCK, 0.9, 0.5, 1e18)
    index = PrefixIndex(closed_chains=True)
    kv = _Tapped(dict.fromkeys(ranks, cache_blocks), limits, BLOCK_TOKENS, BLOCK, index)
    seen: set[tuple[int, ...]] = set()
    for t, (rank, path) in enumerate(ops):
        seen.add(path)
        keys = BlockKeys.of(chain(path), group)
        hit, _ = kv.delivered_hit(ranks[rank], keys, len(path) * BLOCK_TOKENS + 1, float(t))
        kv.store(ranks[rank], keys, hit.rank_hbm + hit.pool_hbm + hit.pool_dram, float(t))
        assert kv.general.prefix_closed and kv.closed.prefix_closed
        assert kv.closed.snapshot() == kv.general.snapshot()
        assert len(index) == 0  # no per-block copy
        for p in every_prefix(seen):
            hashes = list(BlockKeys.of(chain(p), group).keys)
            got = index.match(hashes, BLOCK_TOKENS, len(p) * BLOCK_TOKENS)
            runs = {key: _held_run(kv.caches[key].lru, hashes) for key in ranks}
            assert got.rank_blocks == {key: n for key, n in runs.items() if n}
            for ref in (kv.general, kv.closed):  # the pooled run from 0, cut at each start
                in_hbm, in_dram = ref.match(hashes, BLOCK_TOKENS, len(p) * BLOCK_TOKENS, exact_walk=True).pool_runs[0]
                assert got.pool_runs == {s: (max(0, in_hbm - s), max(0, in_hbm + in_dram - s) - max(0, in_hbm - s))
                                         for s in got.pool_runs}
            assert set(got.pool_runs) == {0, *got.rank_blocks.values()}


def test_an_index_that_delegates_refuses_those_events() -> None:
    index = PrefixIndex(closed_chains=True)
    index.delegate_ranks(lambda hashes: {})
    with pytest.raises(ValueError, match="delegate"):
        index.apply(KVEvent("stored", Publisher("prefill-0", 0), 1, "rank_hbm", (1, 2)))
    index.delegate_pool(lambda hashes: (0, 0))
    with pytest.raises(ValueError, match="delegate"):
        index.apply(KVEvent("stored", Publisher("pool", 0), 1, "pool_hbm", (1, 2)))


def test_closed_chains_index_refuses_snapshots() -> None:
    with pytest.raises(ValueError, match="closed_chains"):
        PrefixIndex(closed_chains=True).resync(Publisher("prefill-0", 0), "rank_hbm", [1, 2], 3)
