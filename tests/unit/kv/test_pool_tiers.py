"""PoolTiers: two-phase puts, leases, LRU watermark eviction with hbm -> dram demotion, events."""

from __future__ import annotations

import pytest

from rackserve.kv.pool_tiers import BlockPut, PoolLimits, PoolTiers

BLOCK = 100


def make_pool(hbm_blocks: int = 10, dram_blocks: int = 10, budget_blocks: int = 1000, lease_s: float = 5.0):
    limits = PoolLimits(hbm_blocks * BLOCK, dram_blocks * BLOCK, budget_blocks * BLOCK,
                        high_watermark=0.9, low_watermark=0.5, lease_s=lease_s)
    return PoolTiers(limits)


def put(pool: PoolTiers, hashes: list[int], now: float = 0.0, parent: int | None = None) -> tuple[int, ...]:
    res = pool.reserve([BlockPut(h, BLOCK) for h in hashes], "w0", now, parent)
    return pool.commit(res.txn, now)


def test_block_is_invisible_until_commit():
    pool = make_pool()
    res = pool.reserve([BlockPut(1, BLOCK), BlockPut(2, BLOCK)], "w0", 0.0)
    assert res.statuses == ("reserved", "reserved")
    assert pool.lookup([1, 2], 0.1).tiers == (None, None)
    assert pool.match_prefix([1, 2], 0.1).count == 0
    assert pool.commit(res.txn, 0.2) == (1, 2)
    assert pool.lookup([1, 2], 0.3).tiers == ("pool_hbm", "pool_hbm")
    assert pool.match_prefix([1, 2, 3], 0.3).count == 2


def test_store_is_reserve_plus_commit():
    pool = make_pool()
    res = pool.store([BlockPut(1, BLOCK), BlockPut(2, BLOCK)], "sim", 0.0)
    assert res.statuses == ("reserved", "reserved") and pool.match_prefix([1, 2], 0.0).count == 2
    assert pool.store([BlockPut(2, BLOCK)], "sim", 1.0).statuses == ("exists",)


def test_commit_in_parts():
    pool = make_pool()
    res = pool.reserve([BlockPut(h, BLOCK) for h in (1, 2, 3)], "w0", 0.0)
    assert pool.commit(res.txn, 0.0, [1, 99]) == (1,)
    assert pool.match_prefix([1], 0.0).count == 1 and pool.match_prefix([2], 0.0).count == 0
    assert pool.commit(res.txn, 0.0, [3]) == ()  # its parent 2 is not stored yet: 3 waits
    assert pool.commit(res.txn, 0.0) == (2, 3)
    assert pool.commit(res.txn, 0.0) == () and pool.usage("pool_hbm").reserved_target_bytes == 0


def test_second_writer_sees_pending_then_exists():
    pool = make_pool()
    first = pool.reserve([BlockPut(7, BLOCK)], "w0", 0.0)
    second = pool.reserve([BlockPut(7, BLOCK)], "w1", 0.0)
    assert second.statuses == ("pending",) and second.to_write == ()
    pool.commit(first.txn, 0.0)
    third = pool.reserve([BlockPut(7, BLOCK)], "w2", 0.0)
    assert third.statuses == ("exists",)
    assert pool.usage("pool_hbm").keys == 1


def test_abort_and_expired_reservation_free_space():
    pool = make_pool(hbm_blocks=2, dram_blocks=0, lease_s=1.0)
    res = pool.reserve([BlockPut(1, BLOCK)], "w0", 0.0)
    pool.abort(res.txn)
    assert pool.usage("pool_hbm").reserved_target_bytes == 0
    res = pool.reserve([BlockPut(2, BLOCK)], "w0", 0.0)
    assert pool.commit(res.txn, 2.0) == ()  # expired at 1.0
    assert not pool.is_known(2) and pool.counters.reservation_expiries == 1
    assert pool.actual_bytes == 0


def test_lru_eviction_demotes_hbm_to_dram_down_to_low_watermark():
    pool = make_pool(hbm_blocks=10, dram_blocks=10)
    for h in range(1, 10):  # 9 blocks = 90% of hbm, at the high watermark
        put(pool, [h], now=float(h))
    pool.lookup([1], now=20.0)  # 1 becomes most recent
    put(pool, [10], now=21.0)  # would exceed 90%: evict until 50% after the allocation
    assert pool.lru_order("pool_hbm") == [7, 8, 9, 1, 10]
    assert pool.lru_order("pool_dram") == [2, 3, 4, 5, 6]
    assert pool.counters.evictions["pool_hbm"] == 5 and pool.counters.demotions == 5
    assert pool.match_prefix([7, 8, 2, 3, 99], 22.0).tiers == ("pool_hbm", "pool_hbm", "pool_dram", "pool_dram")


def test_dram_eviction_drops_blocks_for_good():
    pool = make_pool(hbm_blocks=2, dram_blocks=2)
    for h in range(1, 8):
        put(pool, [h], now=float(h))
    _, dropped = pool.drain()
    assert dropped, "dram evictions must hand back keys to delete"
    for h in dropped:
        assert pool.tier_of(h) is None
    stored = {h for t in ("pool_hbm", "pool_dram") for h in pool.lru_order(t)}
    assert stored.isdisjoint(dropped) and stored | set(dropped) == set(range(1, 8))


def test_lease_blocks_eviction_until_it_expires():
    pool = make_pool(hbm_blocks=2, dram_blocks=0, lease_s=5.0)
    put(pool, [1], now=0.0)
    lease = pool.lookup([1], now=0.0)
    assert lease.lease_id and lease.expires_at == 5.0
    res = pool.reserve([BlockPut(2, BLOCK), BlockPut(3, BLOCK)], "w0", now=1.0)
    assert res.statuses == ("reserved", "no_space")  # 1 is leased, cannot be evicted
    assert pool.tier_of(1) == "pool_hbm" and pool.counters.alloc_failures == 1
    pool.commit(res.txn, 1.0)
    res = pool.reserve([BlockPut(3, BLOCK)], "w0", now=6.0)  # lease expired at 5.0
    assert res.statuses == ("reserved",)
    assert pool.tier_of(1) is None and pool.counters.lease_expiries == 1


def test_hold_leases_stored_blocks_without_touching_or_counting_them():
    pool = make_pool(hbm_blocks=3, dram_blocks=0, lease_s=5.0)
    put(pool, [1], now=0.0)
    put(pool, [9], now=0.5)  # more recent than 1: 1 is the LRU victim
    held = pool.hold([1, 2], now=1.0)  # 2 is not stored: not held
    assert held.lease_id and held.tiers == ("pool_hbm", None) and held.expires_at == 6.0
    assert pool.lru_order("pool_hbm") == [1, 9] and pool.counters.gets == 0  # no touch, no get
    res = pool.reserve([BlockPut(3, BLOCK)], "w0", now=2.0)
    assert res.statuses == ("reserved",) and pool.tier_of(1) == "pool_hbm"  # 9 went instead
    assert pool.tier_of(9) is None
    assert pool.release(held.lease_id)
    assert pool.hold([2], now=2.0).lease_id == 0  # nothing stored, nothing held


def test_released_lease_no_longer_protects():
    pool = make_pool(hbm_blocks=1, dram_blocks=0)
    put(pool, [1])
    lease = pool.lookup([1], 0.0)
    assert pool.remove([1]) == ()
    assert pool.release(lease.lease_id) and not pool.release(lease.lease_id)
    assert pool.remove([1]) == (1,)


def test_budget_of_actual_bytes_drops_lru_blocks():
    pool = make_pool(hbm_blocks=100, dram_blocks=100, budget_blocks=4)
    for h in range(1, 6):
        put(pool, [h], now=float(h))
    assert pool.actual_bytes <= 4 * BLOCK
    assert pool.tier_of(1) is None and pool.tier_of(5) == "pool_hbm"


def test_target_size_is_charged_against_tier_capacity():
    pool = make_pool(hbm_blocks=10, dram_blocks=0)
    res = pool.reserve([BlockPut(1, size=10, target_size=5 * BLOCK)], "w0", 0.0)
    pool.commit(res.txn, 0.0)
    usage = pool.usage("pool_hbm")
    assert (usage.bytes, usage.target_bytes) == (10, 5 * BLOCK)


def test_events_are_numbered_and_carry_chains():
    pool = make_pool(hbm_blocks=4, dram_blocks=10)
    put(pool, [11, 12], parent=None)
    put(pool, [13], parent=12)
    pool.lookup([11], 0.5)
    put(pool, [21], now=1.0)  # 4 of 4 blocks > 90%: demotes 12, 13 (11 was just used)
    events, _ = pool.drain()
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    summary = [(e.kind, e.tier, e.block_hashes, e.parent_hash) for e in events]
    assert summary[0] == ("stored", "pool_hbm", (11, 12, 13), None)  # a continued chain coalesces
    # the demotion run (tails first: 13, then 12) is one removed event and one stored chain piece
    assert summary[1:3] == [("removed", "pool_hbm", (13, 12), None), ("stored", "pool_dram", (12, 13), 11)]
    pool.clear()
    events, _ = pool.drain()
    assert [(e.kind, e.tier, e.seq) for e in events] == [
        ("cleared", "pool_hbm", len(summary) + 1), ("cleared", "pool_dram", len(summary) + 2)]
    assert pool.match_prefix([11, 12, 13], 2.0).count == 0 and pool.actual_bytes == 0


def test_default_block_charge_applies_when_the_put_names_no_target_size():
    limits = PoolLimits(10 * BLOCK, 0, 1 << 30, 0.9, 0.5, block_charge_bytes=2 * BLOCK)
    pool = PoolTiers(limits)
    pool.commit(pool.reserve([BlockPut(1, size=7), BlockPut(2, size=7, target_size=BLOCK)], "w", 0.0).txn, 0.0)
    assert pool.usage("pool_hbm").target_bytes == 3 * BLOCK


@pytest.mark.parametrize("size", [0, 10 * BLOCK + 1])
def test_block_that_can_never_fit_fails_cleanly(size):
    pool = make_pool(hbm_blocks=10, dram_blocks=10)
    if size == 0:
        res = pool.reserve([BlockPut(1, 0)], "w0", 0.0)  # empty block is allowed
        assert res.statuses == ("reserved",)
        return
    assert pool.reserve([BlockPut(1, size)], "w0", 0.0).statuses == ("no_space",)


def test_a_demotion_run_is_flushed_before_the_next_other_event():
    """Merged demotion events keep their place among the other events: a drop that follows the
    run comes after it, so an index replaying the events ends where the pool is."""
    from rackserve.kv.events import Publisher
    from rackserve.kv.pool_outbox import PoolOutbox

    out = PoolOutbox(Publisher("pool", 0))
    out.demote(3, 2)
    out.demote(2, 1)
    out.demote(9, 8)  # another chain's tail: a piece of its own
    out.emit("removed", "pool_dram", 3)
    events, _ = out.drain()
    assert [(e.kind, e.tier, e.block_hashes, e.parent_hash) for e in events] == [
        ("removed", "pool_hbm", (3, 2, 9), None),
        ("stored", "pool_dram", (9,), 8),
        ("stored", "pool_dram", (2, 3), 1),
        ("removed", "pool_dram", (3,), None),
    ]
