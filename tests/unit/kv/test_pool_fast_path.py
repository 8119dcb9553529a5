"""PoolTiers' one-pass chain put and commit (`_reserve_chain`, `_commit_chain`) change nothing: the
same random operations with the fast paths switched off give identical events, commits, lookups,
LRU orders and counters (the simulator's figures depend on every one of them)."""

from __future__ import annotations

import random

import pytest

from rackserve.kv.pool_tiers import BlockPut, PoolTiers
from rackserve.sim.kv import pool_limits


def _trace(pool: PoolTiers, seed: int, steps: int = 1500) -> list:
    rng = random.Random(seed)
    chains: dict[int, list[int]] = {}
    next_hash, pending, out = 1, [], []
    for now in range(steps):
        chain = chains.setdefault(rng.randrange(60), [])
        if rng.random() < 0.03:
            chain.clear()
        new = list(range(next_hash, next_hash + (40 if not chain else rng.randint(1, 6))))
        next_hash += len(new)
        start = rng.choice([len(chain), len(chain), max(0, len(chain) - 3)])  # fresh, or part exists
        put = chain[start:] + new
        chain.extend(new)
        res = pool.reserve([BlockPut(h, rng.choice([1000, 1500])) for h in put], "r", now,
                           parent_hash=chain[start - 1] if start else None)
        out.append((res.statuses, res.tiers))
        pending.append(res.txn)
        if rng.random() < 0.6:  # commit now, or later (children of pending parents wait)
            if rng.random() < 0.3:
                rng.shuffle(pending)
            out += [pool.commit(t, now) for t in pending]
            pending = []
        out.append(pool.lookup([chain[len(chain) // 2]], now, lease=False).tiers)
        events, dropped = pool.drain()
        out.append(([(e.kind, e.tier, e.block_hashes, e.parent_hash, e.seq) for e in events], dropped))
    out.append((pool.lru_order("pool_hbm"), pool.lru_order("pool_dram"), pool.counters))
    return out


@pytest.mark.parametrize(("hbm", "dram"), [(400_000, 1_200_000), (5_000_000, 0), (10**12, 10**12)])
def test_fast_paths_change_nothing(hbm: int, dram: int, monkeypatch: pytest.MonkeyPatch) -> None:
    limits = pool_limits(hbm, dram, 0.95, 0.85)
    fast = _trace(PoolTiers(limits), seed=hbm)
    monkeypatch.setattr(PoolTiers, "_reserve_chain", lambda self, *a: None)
    monkeypatch.setattr(PoolTiers, "_commit_chain", lambda self, *a: None)
    slow = _trace(PoolTiers(limits), seed=hbm)
    assert fast == slow
    assert fast[-1][2].evictions["pool_hbm"] > 0 or hbm == 10**12  # the small pools evict
