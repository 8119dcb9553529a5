"""The simulated cluster's KV: each prefill rank's HBM prefix cache, the rack pool, the router index.

The router's prefix index asks the rank caches and the pool for a request's prefix directly (it
delegates both lookups: zero event lag, and no per-block copy of their contents in the index); the
pool's KV events are still drained, for the blocks it dropped. Pool traffic takes time on its paths (sim/pool_paths.py): a
rank's fetch of pooled blocks finishes when its bytes have crossed, and a put's blocks enter the pool
(and the index) only when its write commits, so a turn arriving meanwhile misses them. Tokens
computed again because their blocks were lost are counted by the tier that lost them ("in_flight":
the put had not committed yet).

Pool scope (sim/pool_scope.py): one pool for the rack, or one per prefill instance (each rank
reads and writes its own instance's pool only). Event lag (routing.event_lag_s): a block a rank
stores, or a put commits, reaches the router's lookups only `event_lag_s` later (its KV event's
trip); the ranks themselves find it at once. `truth()` turns the lag off for one lookup (routing
regret's hindsight).

Leases: a rank's fetch of pooled blocks holds a read lease on them until its bytes have arrived,
so eviction (kv/pool_tiers.py: LRU at the watermarks) never drops a block being read. The pool's
working set against its capacity is sampled over time (sim/pool_trace.py).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from itertools import repeat

from rackserve.kv.pool_tiers import PoolLimits, PoolTiers
from rackserve.routing.index import PrefixIndex
from rackserve.routing.view import PrefixHit, RankId
from rackserve.sim.block_keys import BlockKeys
from rackserve.sim.lru_set import LruSet, prefixes
from rackserve.sim.pool_paths import PoolPaths
from rackserve.sim.pool_trace import PoolTrace


class RankCache:
    """LRU set of block hashes in one rank's HBM (sim/lru_set.py: in C where built). Stores touch a
    chain back to front, so the chain's head is most recent and eviction takes tails first (prefixes
    stay matchable). The router asks the cache itself for a request's prefix (`match`: the index
    delegates rank prefixes to it), so a store publishes no events."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self.evictions = 0
        self.lru = LruSet()
        self.match = self.lru.match  # leading keys present, by bisection (what a rank holds of a chain is a prefix)

    def __len__(self) -> int:
        return len(self.lru)

    def store(self, hashes: Sequence[int], held: int | None = None) -> tuple[int, ...]:
        """Hold (and touch) a chain; returns the keys evicted to make room, least recent first.
        `held`: match(hashes) when the caller has it."""
        n = self.match(hashes) if held is None else held  # held: a prefix (see match); the rest is new
        gone = self.lru.store(hashes, n, self.capacity)
        self.evictions += len(gone)
        return gone


SHORT_LAG_S = 0.005  # up to this event lag the writes still in their lag are a few: kept as key sets


class Visibility:
    """When blocks just written become visible to the router: write done + the KV event's lag.
    Along a chain, earlier blocks were written no later, so what is visible is a prefix. A table of
    each key's last write (for lags longer than SHORT_LAG_S: many writes in their lag at once)."""

    def __init__(self, lag_s: float) -> None:
        self.lag_s = lag_s
        self.at: dict[int, float] = {}
        self._fifo: deque[tuple[float, Sequence[int]]] = deque()

    def add(self, hashes: Sequence[int], written_at: float) -> None:
        if not hashes:
            return
        t = written_at + self.lag_s
        self.at.update(zip(hashes, repeat(t)))
        self._fifo.append((t, hashes))

    def _hidden(self, h: int, now: float) -> bool:
        return self.at.get(h, 0.0) > now

    def _expire(self, now: float) -> None:
        fifo, at = self._fifo, self.at
        while fifo and fifo[0][0] <= now:
            t, done = fifo.popleft()
            for h in done:
                if at.get(h) == t:
                    del at[h]

    def visible(self, hashes: Sequence[int], n: int, now: float) -> int:
        """How many of the `n` leading keys of `hashes` the router sees at `now`."""
        self._expire(now)
        if n == 0 or not self._fifo or not self._hidden(hashes[n - 1], now):
            return n
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) // 2
            if self._hidden(hashes[mid], now):
                hi = mid
            else:
                lo = mid + 1
        return lo


class ShortVisibility(Visibility):
    """Visibility for a short lag: the writes still in their lag (a few at 0.5 ms), each with its
    keys. A write costs nothing per key when its lag ends; a lookup scans the few writes instead
    of a per-key table. A write's key set is made when a lookup first asks it: most writes' lags
    end before any lookup of their rank (at 0.5 ms, a rank's write is usually alone)."""

    def add(self, hashes: Sequence[int], written_at: float) -> None:
        if hashes:
            self._fifo.append([written_at + self.lag_s, hashes, None])  # hashes: a tuple (never changes)

    def _hidden(self, h: int, now: float) -> bool:
        """The key's last write is still in its lag."""
        for write in reversed(self._fifo):
            keys = write[2]
            if keys is None:
                keys = write[2] = set(write[1])
            if h in keys:
                return write[0] > now
        return False

    def _expire(self, now: float) -> None:
        fifo = self._fifo
        while fifo and fifo[0][0] <= now:
            fifo.popleft()


def visibility(lag_s: float) -> Visibility:
    return ShortVisibility(lag_s) if lag_s <= SHORT_LAG_S else Visibility(lag_s)


class ClusterKV:
    def __init__(self, cache_blocks: dict[RankId, int], pool: PoolLimits, block_tokens: int,
                 block_bytes: int, index: PrefixIndex, paths: PoolPaths | None = None,
                 scoped: list[tuple[tuple[str, ...], PoolLimits, PoolPaths | None]] | None = None,
                 event_lag_s: float = 0.0) -> None:
        """`scoped`: one pool per group of prefill instances (pool.scope instance/agentx), each
        with its limits and paths, in place of the one rack pool `pool` / `paths`."""
        self.block_tokens = block_tokens
        self.block_bytes = block_bytes
        self.caches = {key: RankCache(n) for key, n in cache_blocks.items()}
        self._names = tuple(self.caches)  # prefixes(): every rank's match of a prompt in one call
        self._sets = tuple(c.lru for c in self.caches.values())
        groups = scoped if scoped else [((), pool, paths)]
        self.pools = [PoolTiers(limits) for _, limits, _ in groups]
        # puts land in spare HBM when the pool has it, else in DRAM (pool.scope instance/agentx)
        self._put_tier = ["pool_hbm" if limits.hbm_capacity_bytes else "pool_dram" for _, limits, _ in groups]
        self.all_paths = [p for _, _, p in groups]
        self._pool_of = {inst: i for i, (names, _, _) in enumerate(groups) for inst in names}
        self.pool, self.paths = self.pools[0], self.all_paths[0]
        self.index = index
        index.delegate_ranks(self.rank_prefixes)  # the rank caches and the pool answer for themselves
        if scoped:
            index.delegate_instance_pools(self.instance_pool_prefixes)
        else:
            index.delegate_pool(self.pool_prefix)
        self.recomputed_tokens: dict[str, int] = {"rank_hbm": 0, "pool_hbm": 0, "pool_dram": 0, "in_flight": 0}
        self._commits: list[tuple[float, int, int]] = []  # (finish time, txn, pool) of puts still crossing
        self._put_chain: dict[tuple[int, int], tuple[Sequence[int], int]] = {}  # (pool, txn) -> (keys, keys before)
        self._lost: dict[int, str] = {}  # block hash -> tier it was dropped from (gone everywhere)
        self._dropped: set[int] = set()  # blocks a pool dropped, not put again since (working set: not new)
        self._put_failed = [False] * len(self.pools)  # per pool: a put of some block found no room
        self.now = 0.0
        self._truth = False
        self.lag_cuts = 0  # router lookups that the event lag cut short (what they saw was not the truth)
        lag = event_lag_s > 0
        self._rank_vis = {key: visibility(event_lag_s) for key in self.caches} if lag else None
        self._pool_vis = [visibility(event_lag_s) for _ in self.pools] if lag else None
        self._fetch_leases: list[tuple[float, int, int]] = []  # (bytes arrived at, pool, lease id)
        self.trace = PoolTrace()

    def _pool_index(self, rank: RankId) -> int:
        return self._pool_of.get(rank[0], 0)

    # ---- time ---------------------------------------------------------------------------------
    def advance(self, now: float) -> None:
        """Commit every put whose bytes have crossed by `now` (its blocks become visible), release
        the read leases of fetches that have arrived, sample the pool when due."""
        self.now = max(self.now, now)
        leases = self._fetch_leases
        while leases and leases[0][0] <= now:
            _, i, lease = heapq.heappop(leases)
            self.pools[i].release(lease)
        if self.trace.due(now):
            self._sample(now)
        commits = self._commits
        if not commits or commits[0][0] > now:
            return
        touched = set()
        while commits and commits[0][0] <= now:
            done, txn, i = heapq.heappop(commits)
            ks, first = self._put_chain.pop((i, txn))
            self.pools[i].commit(txn, done, ancestors=ks[:first])
            if self._pool_vis is not None:
                self._pool_vis[i].add(ks[first:], done)
            touched.add(i)
        for i in touched:
            self._publish_pool(i)

    def truth(self, on: bool) -> None:
        """Router lookups see every block at once while on (no event lag): hindsight's view."""
        self._truth = on

    # ---- reads --------------------------------------------------------------------------------
    def rank_prefixes(self, hashes: Sequence[int]) -> dict[RankId, int]:
        """Leading keys of `hashes` each rank holds (ranks holding none absent): the router's
        rank lookup (PrefixIndex.delegate_ranks), less what the router has not heard of yet."""
        if not hashes:
            return {}
        found = prefixes(self._sets, self._names, hashes)
        vis = self._rank_vis
        if vis is None or self._truth:
            return found
        now = self.now
        seen = {key: vis[key].visible(hashes, n, now) for key, n in found.items()}
        if seen != found:
            self.lag_cuts += 1
        return {key: n for key, n in seen.items() if n}

    def pool_prefix(self, hashes: Sequence[int], i: int = 0) -> tuple[int, int]:
        """(leading keys pooled, of them in pool_hbm) of pool `i` as the router sees them."""
        n, n_hbm = self.pools[i].held_prefix(hashes)
        if self._pool_vis is None or self._truth or not n:
            return n, n_hbm
        seen = self._pool_vis[i].visible(hashes, n, self.now)
        if seen != n:
            self.lag_cuts += 1
        return seen, min(n_hbm, seen)

    def instance_pool_prefixes(self, hashes: Sequence[int]) -> dict[str, tuple[int, int]]:
        """Per prefill instance, its pool's prefix of `hashes` as the router sees it."""
        if not hashes:
            return {}
        by_pool = [self.pool_prefix(hashes, i) for i in range(len(self.pools))]
        return {inst: by_pool[i] for inst, i in self._pool_of.items() if by_pool[i][0]}

    def held_tokens(self, rank: RankId, keys: BlockKeys, prompt_tokens: int, now: float) -> int:
        """Prompt tokens `rank` would find now (own HBM, then its pool's committed blocks), without
        touching anything: whether a lookup made earlier (a prefetch) has been overtaken."""
        self.advance(now)
        ks = keys.keys
        n_rank = self.caches[rank].match(ks)
        rest = ks[n_rank:]
        n_pool = self.pools[self._pool_index(rank)].stored_prefix(rest, now)[0] if rest else 0
        return min(keys.blocks_in(n_rank + n_pool) * self.block_tokens, max(prompt_tokens - 1, 0))

    def delivered_hit(self, rank: RankId, keys: BlockKeys, prompt_tokens: int, now: float
                      ) -> tuple[PrefixHit, float]:
        """What a rank really finds when it starts a prompt (own HBM, then committed pool blocks;
        capped at prompt - 1) and when the pooled part has arrived in its HBM."""
        if prompt_tokens <= 0:
            return PrefixHit(), now  # nothing to compute, nothing to find
        self.advance(now)
        lru = self.caches[rank].lru
        ks = keys.keys
        n_rank = self.caches[rank].match(ks)
        rest = ks[n_rank:]
        pi = self._pool_index(rank)
        pool = self.pools[pi]
        n_pool, n_phbm = pool.stored_prefix(rest, now) if rest else (0, 0)
        if n_pool:
            # refresh LRU as a lookup of the last hit does: it and its stored ancestors, which are
            # ks[:n_rank + n_pool] (a key's parent is the key before it; the pool is prefix-closed)
            pool.lookup_prefix(ks, n_rank + n_pool, now)
        end = n_rank + n_pool
        blocks = {"rank_hbm": keys.blocks_in(n_rank), "pool_hbm": 0, "pool_dram": 0}
        if n_pool:  # every key covers `group` blocks but the prompt's tail key
            n_dram = n_pool - n_phbm
            blocks["pool_dram"] = n_dram * keys.group
            blocks["pool_hbm"] = n_phbm * keys.group
            blocks["pool_dram" if n_dram else "pool_hbm"] -= keys.group - keys.element_blocks(end - 1)
        if end < len(ks):  # an earlier, shorter prompt's tail inside the next group
            extra = keys.refine(end, lambda span: lru.among(span) | pool.stored_among(span))
            if extra:
                found = keys.blocks[keys.blocks_in(end) + extra - 1]
                blocks["rank_hbm" if found in lru else pool.tier_of(found)] += extra
            self._count_lost(rest[n_pool:], keys, pool)
        bs = self.block_tokens
        room = prompt_tokens - 1
        t_rank = min(blocks["rank_hbm"] * bs, room)
        t_phbm = min(blocks["pool_hbm"] * bs, room - t_rank)
        t_pdram = min(blocks["pool_dram"] * bs, room - t_rank - t_phbm)
        ready = now
        paths = self.all_paths[pi]
        if paths is not None:
            per_token = self.block_bytes / bs
            ready = max(paths.transfer(now, rank, "pool_hbm", "read", t_phbm * per_token),
                        paths.transfer(now, rank, "pool_dram", "read", t_pdram * per_token))
        if n_pool and ready > now:  # the blocks being read stay until their bytes have arrived
            lease = pool.hold(list(rest[:n_pool]), now).lease_id
            if lease:
                heapq.heappush(self._fetch_leases, (ready, pi, lease))
        return PrefixHit(t_rank, t_phbm, t_pdram), ready

    def _count_lost(self, missed: Sequence[int], keys: BlockKeys, pool: PoolTiers) -> None:
        """Keys about to be computed that existed before: pending in a put, or dropped by a tier.
        Chained hashes: the first never-seen key ends the search (all later ones are new too)."""
        lost = self._lost
        tokens = keys.group * self.block_tokens
        reason = "in_flight"
        for h in missed:
            tier = lost.get(h)
            if tier is None:
                if not pool.is_known(h):
                    return
                # pending in a put, or stored but unreachable behind an earlier missing key
                tier = "in_flight" if pool.tier_of(h) is None else reason
            reason = tier
            self.recomputed_tokens[tier] += tokens

    # ---- writes -------------------------------------------------------------------------------
    def store(self, rank: RankId, keys: BlockKeys, delivered_tokens: int, now: float) -> None:
        """A rank finished a prompt: its keys enter the rank's HBM at once; its chain goes to the
        pool (the keys it computed, past the `delivered_tokens` it found, are new there), visible
        when the write commits."""
        self.advance(now)
        cache = self.caches[rank]
        held = cache.match(keys.keys)
        if self._rank_vis is not None:
            self._rank_vis[rank].add(keys.keys[held:], now)
        gone = cache.store(keys.keys, held)
        pi = self._pool_index(rank)
        pool, paths = self.pools[pi], self.all_paths[pi]
        if gone and (self._put_failed[pi] or pool.forgotten):
            # a key a rank held is unknown to its pool only if a put of it failed or the pool let it go
            # (every key a rank stores is put, or already known): until then there is nothing to look up
            self._lost.update(dict.fromkeys(pool.unknown(gone), "rank_hbm"))
        first = delivered_tokens // (self.block_tokens * keys.group)
        if not keys.keys[first:]:
            return
        # the chain from its first key the pool lacks, as a live rank puts it: the pool stores a key
        # only after its parent, so its chains stay matchable from the start (prefix-closed, so the
        # first missing key is found by bisection)
        ks = keys.keys
        first = pool.first_unknown(ks)
        fresh = ks[first:]
        if not fresh:
            return
        parent = ks[first - 1] if first else None
        size = keys.group * self.block_bytes
        last = keys.element_blocks(len(ks) - 1) * self.block_bytes
        res = pool.reserve_chain(fresh, size, last, f"{rank[0]}/{rank[1]}", now, parent_hash=parent)
        if res.statuses.count("reserved") == len(fresh):  # the common put: every key is written
            written, to_write = size * (len(fresh) - 1) + last, fresh
        else:
            written = sum(size if i + 1 < len(fresh) else last for i in res.to_write)
            to_write = tuple(fresh[i] for i in res.to_write)
            if "no_space" in res.statuses:
                self._put_failed[pi] = True
        if to_write:
            done = now if paths is None else paths.transfer(now, rank, self._put_tier[pi], "write", written)
            lost = self._lost
            if lost:
                deque(map(lost.__delitem__, lost.keys() & to_write), maxlen=0)
            again = self._dropped.intersection(to_write) if self._dropped else ()  # put before: not new
            if again:
                self._dropped.difference_update(again)
            self.trace.put(written - len(again) * size)
            if done <= now:
                pool.commit(res.txn, now, ancestors=ks[:first])
                if self._pool_vis is not None:
                    self._pool_vis[pi].add(fresh, now)
            else:
                heapq.heappush(self._commits, (done, res.txn, pi))
                self._put_chain[(pi, res.txn)] = (ks, first)
        self._publish_pool(pi)

    def _publish_pool(self, i: int = 0) -> None:
        events, dropped = self.pools[i].drain()  # numbered, not indexed: the index asks the pool itself
        if dropped:
            self._dropped.update(dropped)
            from_dram = {h for ev in events if ev.kind == "removed" and ev.tier == "pool_dram" for h in ev.block_hashes}
            for h in dropped:
                self._lost[h] = "pool_dram" if h in from_dram else "pool_hbm"

    # ---- report -------------------------------------------------------------------------------
    def _sample(self, now: float) -> None:
        held = sum(p.held_target_bytes for p in self.pools)
        cap = sum(p.limits.hbm_capacity_bytes + p.limits.dram_capacity_bytes for p in self.pools)
        evicted = sum(n for p in self.pools for t, n in p.counters.evictions.items() if t == "pool_dram")
        self.trace.record(now, held, cap, evicted)

    def pool_trace(self) -> dict:
        """The working set against the capacity over time, ending with a sample at `now`."""
        self._sample(self.now)
        return self.trace.to_dict()

    def pool_occupancy(self) -> dict[str, float]:
        """Held / capacity of each tier, over every pool."""
        out = {}
        for tier in ("pool_hbm", "pool_dram"):
            used = [p.usage(tier) for p in self.pools]
            cap = sum(u.capacity_bytes for u in used)
            out[tier] = sum(u.target_bytes for u in used) / cap if cap else 0.0
        return out

    def evictions(self) -> dict[str, int]:
        ev: dict[str, int] = {}
        for p in self.pools:
            for tier, n in p.counters.evictions.items():
                ev[tier] = ev.get(tier, 0) + n
        ev["rank_hbm"] = sum(c.evictions for c in self.caches.values())
        return ev

    def path_utilization(self, span_s: float) -> dict[str, float]:
        """Busy fraction of each path, the busiest pool's where there are several."""
        out: dict[str, float] = {}
        for paths in self.all_paths:
            if paths is not None:
                for k, v in paths.utilization(span_s).items():
                    out[k] = max(out.get(k, 0.0), v)
        return out


def pool_limits(hbm_bytes: int, dram_bytes: int, high: float, low: float) -> PoolLimits:
    """Simulator pool limits: capacities in target bytes; the actual-byte budget never binds."""
    return PoolLimits(hbm_bytes, dram_bytes, budget_bytes=max(1, hbm_bytes + dram_bytes) * 2,
                      high_watermark=high, low_watermark=low, lease_s=1e18)
