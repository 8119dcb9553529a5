"""PoolTiers' one-pass chain put and commit (`_reserve_chain`, `_commit_chain`) change nothing: the
same random operations with the fast paths switched off give identical events, commits, lookups,
LRU orders and counters (the simulator's figures depend on every one of them)."""

from __future__ import annotations

import random

import pytest

from rackserve.kv import pool_chains
from rackserve.kv.pool_tiers import BlockPut, PoolLimits, PoolTiers
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


def _chain_trace(pool: PoolTiers, seed: int, by_chain: bool) -> list:
    """Puts of chains (one size but the last), commits, and prefix lookups; `by_chain` uses the
    simulator's calls (reserve_chain, commit with ancestors, lookup_prefix), else the general ones."""
    rng = random.Random(seed)
    chains: list[list[int]] = [[] for _ in range(30)]
    next_hash, out = 1, []
    for now in range(800):
        chain = chains[rng.randrange(30)]
        if rng.random() < 0.05:
            chain.clear()
        first = len(chain)
        chain += range(next_hash, next_hash + rng.randint(1, 30))
        next_hash = chain[-1] + 1
        fresh, parent, last = chain[first:], chain[first - 1] if first else None, rng.choice([300, 1000])
        if by_chain:
            res = pool.reserve_chain(fresh, 1000, last, "r", now, parent_hash=parent)
            out.append(pool.commit(res.txn, now, ancestors=chain[:first]))
        else:
            puts = [BlockPut(h, 1000) for h in fresh[:-1]] + [BlockPut(fresh[-1], last)]
            res = pool.reserve(puts, "r", now, parent_hash=parent)
            out.append(pool.commit(res.txn, now))
        probe = chains[rng.randrange(30)]
        end = pool.stored_prefix(probe, now)[0]
        if end:
            if by_chain:
                pool.lookup_prefix(probe, end, now)
            else:
                pool.lookup([probe[end - 1]], now, lease=False)
        out.append((res.statuses, end, pool.drain()[0]))
    out.append((pool.lru_order("pool_hbm"), pool.lru_order("pool_dram"), pool.counters))
    return out


@pytest.mark.parametrize(("hbm", "dram"), [(300_000, 900_000), (10**12, 10**12)])
def test_simulator_calls_equal_general_calls(hbm: int, dram: int) -> None:
    limits = pool_limits(hbm, dram, 0.95, 0.85)
    sim = _chain_trace(PoolTiers(limits), hbm, by_chain=True)
    general = _chain_trace(PoolTiers(limits), hbm, by_chain=False)
    assert sim == general
    assert sim[-1][2].evictions["pool_dram"] > 0 or hbm == 10**12


def test_forked_chains_keep_every_child() -> None:
    """Two chains share a parent: children() lists both, and dropping one keeps the other linked."""
    pool = PoolTiers(pool_limits(10**9, 10**9, 0.95, 0.85))
    pool.commit(pool.reserve_chain([1], 10, 10, "r", 0.0).txn, 0.0)
    for tail in ([2, 3], [4], [5, 6]):
        pool.commit(pool.reserve_chain(tail, 10, 10, "r", 0.0, parent_hash=1).txn, 0.0)
    assert [b.block_hash for b in pool._chains.children(1)] == [2, 4, 5]
    assert pool.remove([2, 4]) == (3, 2, 4)
    assert [b.block_hash for b in pool._chains.children(1)] == [5]
    assert not pool._chains.is_leaf(pool._chains.get(1))
    assert pool.remove([5]) == (6, 5)
    assert pool._chains.is_leaf(pool._chains.get(1))


@pytest.mark.parametrize("fast", [True, False])
def test_pins_are_forgotten_once_no_put_waits(fast: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A parent is pinned while a child of it is reserved; once every put has committed (or was
    released), no pin is left, not even at 0 (a Counter of every block ever put grew without end)."""
    if not fast:
        monkeypatch.setattr(PoolTiers, "_reserve_chain", lambda self, *a: None)
        monkeypatch.setattr(PoolTiers, "_commit_chain", lambda self, *a: None)
    pool = PoolTiers(pool_limits(400_000, 1_200_000, 0.95, 0.85))
    _trace(pool, seed=7, steps=300)  # leaves some reservations pending
    for txn in list(pool._txns):
        pool.commit(txn, 300.0)
    assert pool._pinned == {} and not pool._pending


@pytest.mark.parametrize(("hbm", "dram"), [(400_000, 1_200_000), (5_000_000, 0)])
def test_eviction_reading_the_lru_front_in_chunks_equals_a_copy_of_the_tier(
        hbm: int, dram: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eviction walks a tier's LRU front chunk by chunk (PoolChains._front); chunks of 2, 4, 8...
    blocks (so every eviction spans several) give the same events and orders as the whole tier
    copied first (the walk before chunking)."""
    limits = pool_limits(hbm, dram, 0.95, 0.85)
    monkeypatch.setattr(pool_chains, "_FIRST_CHUNK", 2)
    chunked = _trace(PoolTiers(limits), seed=hbm + 1)
    monkeypatch.setattr(pool_chains.PoolChains, "_front", lambda self, tier: iter(self.blocks(tier)))
    copied = _trace(PoolTiers(limits), seed=hbm + 1)
    assert chunked == copied
    assert chunked[-1][2].evictions["pool_hbm"] > 0


def _with_chains(limits, lazy: bool, limit: int | None = None) -> PoolTiers:
    pool = PoolTiers(limits)
    pool._chains = pool_chains.PoolChains(lazy=lazy)
    if limit is not None:  # a small log: compaction and replays on size happen too
        pool._chains._limit = limit
    return pool


@pytest.mark.parametrize(("hbm", "dram"), [(400_000, 1_200_000), (300_000, 900_000), (10**12, 10**12)])
@pytest.mark.parametrize("limit", [None, 3])
def test_lazy_lru_order_equals_eager(hbm: int, dram: int, limit: int | None) -> None:
    """The LRU order kept as a log (replayed when read, superseded paths dropped) gives the same
    events, evictions, commits, lookups and final orders as applying every touch at once, under the
    general calls, the simulator's chain calls, and forked chains (_trace restarts chains part-way)."""
    limits = pool_limits(hbm, dram, 0.95, 0.85)
    lazy = _trace(_with_chains(limits, True, limit), seed=hbm + 1)
    eager = _trace(_with_chains(limits, False), seed=hbm + 1)
    assert lazy == eager
    lazy_sim = _chain_trace(_with_chains(limits, True, limit), hbm + 2, by_chain=True)
    eager_sim = _chain_trace(_with_chains(limits, False), hbm + 2, by_chain=True)
    assert lazy_sim == eager_sim
    assert lazy_sim[-1][2].evictions["pool_hbm"] > 0 or hbm == 10**12


def test_lazy_order_drops_contained_paths_and_replays_on_read() -> None:
    """A turn's touch of its whole history supersedes the previous turn's entry (the log keeps one
    live entry per conversation); reading the order replays it, and equals the eager order."""
    limits = pool_limits(10**12, 10**12, 0.95, 0.85)
    pools = [_with_chains(limits, True), _with_chains(limits, False)]
    for pool in pools:
        convs: list[list[int]] = [[] for _ in range(4)]
        for turn in range(5):  # each turn reads its conversation's history, then puts two blocks more
            for c, history in enumerate(convs):
                if history:
                    pool.lookup_prefix(history, len(history), float(turn))
                new = [c * 1000 + len(history) + 1, c * 1000 + len(history) + 2]
                res = pool.reserve_chain(new, 10, 10, "r", float(turn), parent_hash=history[-1] if history else None)
                pool.commit(res.txn, float(turn), ancestors=tuple(history))
                history += new
        pool.lookup_prefix(convs[0], 2, 6.0)  # a shorter read: contained in nothing later
    chains = pools[0]._chains
    live = [e for e in chains._log if e[0] is not None]
    assert len(live) == 4 + 1  # each conversation's last commit, and the short read
    assert len(chains._log) > 20  # the others were logged, then found contained
    raw = list(chains._lru["pool_hbm"])
    assert raw != list(pools[1]._chains._lru["pool_hbm"])  # not applied yet
    assert pools[0].lru_order("pool_hbm") == pools[1].lru_order("pool_hbm")
    assert not chains._log  # the read replayed it


def test_lazy_order_keeps_only_the_tail_of_a_path_a_later_turn_refills() -> None:
    """A prompt that ended inside a block group put a tail block the next turn does not share (it
    fills that group with a new block under the same parent): the older entry keeps that tail
    alone, and the replayed order still equals the eager one."""
    limits = pool_limits(10**12, 10**12, 0.95, 0.85)
    pools = [_with_chains(limits, True), _with_chains(limits, False)]
    for pool in pools:
        full: list[list[int]] = [[] for _ in range(4)]
        for turn in range(5):
            for c, history in enumerate(full):
                if history:
                    pool.lookup_prefix(history, len(history), float(turn))
                base = c * 1000 + 10 * turn
                res = pool.reserve_chain([base + 1, base + 2], 10, 5, "r", float(turn),
                                         parent_hash=history[-1] if history else None)
                pool.commit(res.txn, float(turn), ancestors=tuple(history))
                history.append(base + 1)  # the next turn shares base + 1, not the tail base + 2
    chains = pools[0]._chains
    live = [e for e in chains._log if e[0] is not None]
    singles = [e for e in live if e[0] == pool_chains._ADD]
    assert len(live) == 4 * 5 and len(singles) == 4 * 4  # last commits, and every earlier tail alone
    assert sorted(e[1] for e in singles) == sorted(c * 1000 + 10 * t + 2 for c in range(4) for t in range(4))
    assert pools[0].lru_order("pool_hbm") == pools[1].lru_order("pool_hbm")


def _mixed_trace(pool: PoolTiers, seed: int, steps: int = 1200) -> list:
    """Every call of the pool, at random, on overlapping chains: puts by `reserve` and `reserve_chain`
    (some with a hash twice, some re-offering pending or stored blocks, some under a pending parent),
    commits whole, in parts, late or never (abort, expiry), leases, removals and every query; each
    step's results and the pool's state (orders, pins, pending) are recorded. A put the one-pass path
    keeps as one record must behave, under each of these calls, as its per-block entries did."""
    rng = random.Random(seed)
    chains: list[list[int]] = [[] for _ in range(12)]
    next_hash, txns, leases, out = 1, [], [], []
    now = 0.0
    for _ in range(steps):
        now += rng.choice([0.0, 0.02, 0.05, 0.3])
        chain = chains[rng.randrange(len(chains))]
        op = rng.random()
        if op < 0.35:  # a put
            if rng.random() < 0.04 or (chain and not pool.is_known(chain[-1]) and rng.random() < 0.8):
                chain.clear()  # a new conversation (mostly once this one's last put was lost)
            new = list(range(next_hash, next_hash + rng.randint(1, 8)))
            next_hash += len(new)
            start = rng.choice([len(chain), len(chain), len(chain), max(0, len(chain) - rng.randint(1, 4))])
            put = chain[start:] + new
            if rng.random() < 0.05:
                put.append(put[0])  # a hash twice: the general path
            chain.extend(new)
            parent = chain[start - 1] if start else None
            if rng.random() < 0.5:
                res = pool.reserve_chain(put, 1000, rng.choice([300, 1000]), "r", now, parent_hash=parent)
            else:
                res = pool.reserve([BlockPut(h, rng.choice([1000, 1500]), rng.choice([0, 800])) for h in put],
                                   "w", now, parent_hash=parent)
            out.append((res.txn, res.statuses, res.tiers, res.expires_at))
            txns.append((res.txn, put))
        elif op < 0.65:
            if not txns:
                continue  # a commit: whole, in parts, of a random earlier put
            txn, put = txns.pop(rng.randrange(len(txns))) if rng.random() < 0.4 else txns.pop()
            kind = rng.random()
            if kind < 0.2:
                part = [h for h in put if rng.random() < 0.5]
                out.append(pool.commit(txn, now, hashes=part))
                txns.append((txn, put))  # the rest, later
            elif kind < 0.3:
                out.append(pool.abort(txn))
            else:
                idx = next((i for i, c in enumerate(chains) if put and put[0] in c), None)
                ancestors = ()
                if idx is not None and rng.random() < 0.5:
                    c = chains[idx]
                    ancestors = tuple(c[:c.index(put[0])])
                out.append(pool.commit(txn, now, ancestors=ancestors))
        elif op < 0.75:
            probe = chain[: rng.randint(0, len(chain))]
            end = pool.stored_prefix(probe, now)[0]
            out.append(("prefix", end, pool.held_prefix(probe), pool.match_prefix(probe, now)))
            if end:
                pool.lookup_prefix(probe, end, now)
        elif not chain:
            continue
        elif op < 0.82:
            look = pool.lookup(rng.sample(chain, min(3, len(chain))), now, lease=rng.random() < 0.5)
            out.append(look)
            if look.lease_id:
                leases.append(look.lease_id)
        elif op < 0.86:
            held = pool.hold(chain[-3:], now)
            out.append(held)
            if held.lease_id:
                leases.append(held.lease_id)
        elif op < 0.9:
            if leases:
                out.append(pool.release(leases.pop(rng.randrange(len(leases)))))
        elif op < 0.93:
            out.append(pool.remove([rng.choice(chain)]))
        elif op < 0.932:
            out.append(pool.clear())
        else:
            out.append(("q", [pool.is_known(h) for h in chain], pool.unknown(chain),
                        [pool.tier_of(h) for h in chain], sorted(pool.stored_among(chain))))
        out.append(pool.drain())
        out.append((pool.forgotten, pool.actual_bytes, pool.usage("pool_hbm"), pool.usage("pool_dram")))
        if rng.random() < 0.1:  # the state behind: orders, pins, what is pending (as per-block entries)
            out.append((pool.lru_order("pool_hbm"), pool.lru_order("pool_dram"), sorted(pool._txns),
                        {h: pool._tier_after(h) for h in pool._pending}))  # a pending block's tier
    out.append((pool.lru_order("pool_hbm"), pool.lru_order("pool_dram"), pool.counters, pool.forgotten))
    for txn, _ in txns:  # every put left commits: no pin or entry may be left over
        out.append(pool.commit(txn, now + 1.0))
    out.append((pool.drain(), {k: v for k, v in pool._pinned.items() if v}, pool._waiting, pool._pending))
    out.append(pool.counters)
    return out


def _slow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(PoolTiers, "_reserve_chain", lambda self, *a: None)
    monkeypatch.setattr(PoolTiers, "_commit_chain", lambda self, *a: None)


@pytest.mark.parametrize(("hbm", "dram", "lease_s", "charge"),
                         [(60_000, 180_000, 3.0, 0), (40_000, 0, 1e9, 0), (10**9, 10**9, 2.0, 700),
                          (80_000, 120_000, 1e9, 900)])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_one_record_per_put_equals_per_block_entries(hbm: int, dram: int, lease_s: float, charge: int, seed: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-pass put keeps its blocks pending as one record until its one-pass commit; every other
    call on them (a part commit, an abort, an expiry, a put of the same blocks or of their children, a
    commit that must wait) works on per-block entries made from it. The same random calls give the
    same results and states as the general path alone, lazily and eagerly ordered."""
    limits = PoolLimits(hbm, dram, budget_bytes=max(hbm + dram, 1) * 2, lease_s=lease_s, block_charge_bytes=charge)
    fast = _mixed_trace(PoolTiers(limits), seed)
    eager = _mixed_trace(_with_chains(limits, False), seed)
    small_log = _mixed_trace(_with_chains(limits, True, 3), seed)
    _slow(monkeypatch)
    slow = _mixed_trace(PoolTiers(limits), seed)
    assert fast == slow
    assert eager == slow
    assert small_log == slow
    counters = slow[-1]
    assert counters.puts > 100 and counters.committed_blocks > 100
    assert counters.evictions["pool_hbm"] > 0 or hbm == 10**9
    assert counters.reservation_expiries > 0 or lease_s > 100


@pytest.mark.parametrize(("hbm", "dram"), [(400_000, 1_200_000), (10**12, 10**12)])
def test_rooted_marks_find_what_asking_every_block_finds(hbm: int, dram: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A path known from its root finds the logged marks on it among its root's (by depth): at every
    call, exactly the marks that asking for each of its marked blocks finds; paths known only in
    part (general commits of a chain whose parent is stored) switch to asking until a replay. The
    order stays the eager one under both kinds of calls."""
    seen = {"rooted": 0, "found": 0, "loose": 0}
    found_rooted, root_of = pool_chains.PoolChains._found_rooted, pool_chains.PoolChains._root_of

    def checked(self, root, keys, more, span):
        path = (tuple(more) if more else ()) + tuple(keys)
        want = set(self._marks) & set(path[:span])  # what marks.keys() & part finds over the marked parts
        got = found_rooted(self, root, keys, more, span)
        assert sorted(got) == sorted(want)
        seen["rooted"] += 1
        seen["found"] += len(got)
        return got

    def counted(self, keys, more):
        root = root_of(self, keys, more)
        seen["loose"] += root is None
        return root

    monkeypatch.setattr(pool_chains.PoolChains, "_found_rooted", checked)
    monkeypatch.setattr(pool_chains.PoolChains, "_root_of", counted)
    limits = pool_limits(hbm, dram, 0.95, 0.85)
    for trace in (lambda p: _chain_trace(p, hbm + 2, by_chain=True), lambda p: _trace(p, seed=hbm + 1)):
        assert trace(_with_chains(limits, True)) == trace(_with_chains(limits, False))
    assert seen["rooted"] > 500 and seen["found"] > 100 and seen["loose"] > 0
