"""Which (instance, DP rank) HBM cache and which pool tier holds which KV block, fed by KV events.

Block hashes are chained (rackserve.kv.block_hash): a hash names its whole prefix, so a flat map
hash -> holders is a prefix index without a tree. Holders are bits of one Python int per block,
so "who holds block i" is one dict lookup whatever the number of ranks. While every holder's set
is prefix-closed (rackserve.routing.closure; the usual case: caches store and evict whole chain
tails), each rank's first miss along the request's chain is found by binary search - a few dozen
lookups for a 1,000-block prompt. Otherwise (holes, snapshot blocks of unknown parent, a stale
pool) it falls back to an exact walk whose lookups run in C (map + itertools.accumulate).

Per-publisher sequence numbers: a gap marks that publisher stale (its entries are kept but not
trusted) until a `cleared` event or `resync` rebuilds it; events at or below the last seen
number are duplicates and ignored, so replaying a stream rebuilds the identical index. A larger
epoch is a restarted publisher (its numbers start at 1 again): what it held is dropped, stale
marks included, and its new events are followed; events of an older epoch are ignored.

The index is split by concept: this file has its state, events, staleness and snapshots;
index_lookup.py the lookups, index_holders.py the per-block holder tables (and the closed-chains
mode's short paths), index_pool.py the pool holders' tier flags and closures.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rackserve.kv.events import KVEvent, Publisher, Tier
from rackserve.routing.closure import UNKNOWN_PARENT, PrefixClosure
from rackserve.routing.index_holders import HolderKey, IndexHolders
from rackserve.routing.index_lookup import IndexLookup, InstancePoolLookup, PoolLookup, RankLookup
from rackserve.routing.view import RankId

__all__ = ["HolderKey", "IndexSnapshot", "PrefixIndex"]


@dataclass(frozen=True)
class IndexSnapshot:
    """Comparable contents of an index: blocks per holder, stale holders, last sequence numbers."""

    blocks: dict[tuple[str, int, str], frozenset[int]]
    stale: frozenset[tuple[str, int, str]]
    seqs: dict[tuple[str, int], int]


class PrefixIndex(IndexLookup, IndexHolders):
    """The router's view of where KV blocks live, kept current by `apply(event)`.

    Contract on events: a stored event's `parent_hash` names the parent of its first block (None
    only when that block starts a chain); the other blocks follow one another in the chain.

    `closed_chains`: the publishers promise that every holder stays prefix-closed (the offline
    simulator's rank caches and pool: stores after parents, evictions tails first), so lookups
    always take the binary search and no orphan or parent bookkeeping is kept: a store or removal
    is then a few C-level passes per event. Snapshots (`resync`) are refused in that mode.

    `delegate_ranks(lookup)` / `delegate_pool(lookup)`: the holders answer their prefixes
    themselves (the offline simulator's rank LRUs and pool bisect their own chains, with no event
    lag), so the index keeps no per-block copy of them and refuses their events; `match` asks
    the lookups instead.
    """

    def __init__(self, closed_chains: bool = False) -> None:
        self._closed_chains = closed_chains
        self._bit_of: dict[HolderKey, int] = {}
        self._holders: list[HolderKey] = []
        self._contents: list[set[int]] = []
        self._closures: list[PrefixClosure | None] = []  # per rank_hbm holder
        self._rank_key: dict[int, RankId] = {}  # bit -> rank, for rank_hbm holders
        self._keys_of: dict[int, tuple[RankId, ...]] = {}  # rank bit set -> its ranks
        self._rank: dict[int, int] = {}  # hash -> bits of rank_hbm holders (stale ones included)
        self._pool_mask: dict[int, int] = {}  # hash -> bits of pool holders (stale ones included)
        self._pool: dict[int, int] = {}  # hash -> POOL_IN_* (index_pool.py) flags over trusted pool holders
        self._pool_bits = {"pool_hbm": 0, "pool_dram": 0}
        self._pool_any = PrefixClosure()  # union of every pool holder
        self._pool_hbm = PrefixClosure()  # union of the spare-HBM pool holders
        self._parent: dict[int, int | None] = {}  # hash -> parent hash, while anyone holds it
        self._unknown: set[int] = set()  # held hashes whose parent is UNKNOWN_PARENT (a snapshot's)
        self._orphans = 0  # over every closure: 0 = binary-search lookups are exact
        self._stale: set[HolderKey] = set()
        self._stale_bits = 0
        self._tiers_of: dict[Publisher, set[Tier]] = {}
        self._seq: dict[Publisher, int] = {}
        self._epoch: dict[Publisher, int] = {}
        self._rank_lookup: RankLookup | None = None
        self._pool_lookup: PoolLookup | None = None
        self._instance_pools: InstancePoolLookup | None = None

    def delegate_ranks(self, lookup: RankLookup) -> None:
        """Rank prefixes come from `lookup(block_hashes) -> {rank: leading blocks held}` (ranks
        holding none absent); rank_hbm events are refused from now on. Only before any event."""
        if self._seq:
            raise ValueError("delegate_ranks: the index has taken events already")
        self._rank_lookup = lookup

    def delegate_pool(self, lookup: PoolLookup) -> None:
        """The pool's prefix comes from `lookup(block_hashes) -> (leading blocks in the pool, of
        which in pool_hbm)` (a prefix-closed pool whose tiers only slow down along a chain); pool
        events are refused from now on. Only before any event."""
        if self._seq:
            raise ValueError("delegate_pool: the index has taken events already")
        self._pool_lookup = lookup

    def delegate_instance_pools(self, lookup: InstancePoolLookup) -> None:
        """A pool per prefill instance (pool.scope instance/agentx): `lookup(block_hashes) ->
        {instance: (leading blocks in its pool, of which in pool_hbm)}` (instances holding none
        absent); pool events are refused from now on. Only before any event."""
        self.delegate_pool(lambda hashes: (0, 0))
        self._instance_pools = lookup

    # ---- events -------------------------------------------------------------------------------

    def apply(self, event: KVEvent) -> bool:
        """Apply one event; False when it is a duplicate (seq at or below the last seen) or from
        an older epoch of its publisher."""
        pub = event.publisher
        epoch = self._epoch.setdefault(pub, event.epoch)
        if event.epoch < epoch:
            return False
        if event.epoch > epoch:
            self._start_over(pub, event.epoch)
        last = self._seq.get(pub, 0)
        if event.seq <= last:
            return False
        if (self._rank_lookup if event.tier == "rank_hbm" else self._pool_lookup) is not None:
            raise ValueError(f"{event.tier} event to an index that delegates those prefixes (delegate_ranks/_pool)")
        self._tiers_of.setdefault(pub, set()).add(event.tier)
        if event.seq != last + 1:
            self._mark_stale(pub)
        self._seq[pub] = event.seq
        hashes = event.block_hashes
        if event.kind == "stored":  # a closed_chains index keeps no parents: none are built
            parents = () if self._closed_chains else (event.parent_hash, *hashes[:-1])
            self._store(self._bit(pub, event.tier), hashes, parents)
        elif event.kind == "removed":
            self._remove(self._bit(pub, event.tier), hashes)
        else:
            self._reset(pub, event.tier, (), ())
        return True

    def _start_over(self, pub: Publisher, epoch: int) -> None:
        """`pub` restarted: forget every tier it held (trusted again, empty), count from 0."""
        for tier in self._tiers_of.get(pub, ()):
            self._reset(pub, tier, (), ())
        self._epoch[pub] = epoch
        self._seq[pub] = 0

    def apply_all(self, events: Iterable[KVEvent]) -> int:
        """Apply events in order; returns how many were new."""
        return sum(self.apply(e) for e in events)

    def resync(
        self,
        publisher: Publisher,
        tier: Tier,
        block_hashes: Sequence[int],
        seq: int,
        parent_hashes: Sequence[int | None] | None = None,
    ) -> None:
        """Replace `publisher`'s view of `tier` by a snapshot taken at sequence number `seq`.

        parent_hashes (aligned with block_hashes) keep lookups on the fast path; blocks whose
        parent is neither given nor already known make lookups take the exact walk.
        """
        if self._closed_chains:
            raise ValueError("a closed_chains index takes no snapshots (their parents may be unknown)")
        if seq < 0:
            raise ValueError(f"seq must be >= 0, got {seq}")
        if parent_hashes is not None and len(parent_hashes) != len(block_hashes):
            raise ValueError("parent_hashes must be as long as block_hashes")
        parents = (
            parent_hashes if parent_hashes is not None else [UNKNOWN_PARENT] * len(block_hashes)
        )
        self._tiers_of.setdefault(publisher, set()).add(tier)
        self._reset(publisher, tier, tuple(block_hashes), tuple(parents))
        self._seq[publisher] = seq

    def is_stale(self, publisher: Publisher) -> bool:
        return any((publisher, t) in self._stale for t in self._tiers_of.get(publisher, ()))

    def stale_publishers(self) -> frozenset[Publisher]:
        return frozenset(p for p, _ in self._stale)

    def last_seq(self, publisher: Publisher) -> int:
        return self._seq.get(publisher, 0)

    def blocks(self, publisher: Publisher, tier: Tier) -> frozenset[int]:
        bit = self._bit_of.get((publisher, tier))
        return frozenset() if bit is None else frozenset(self._contents[bit])

    @property
    def prefix_closed(self) -> bool:
        """True when lookups take the binary-search path (no holes, no stale pool holder)."""
        pool_bits = self._pool_bits["pool_hbm"] | self._pool_bits["pool_dram"]
        return self._orphans == 0 and not self._stale_bits & pool_bits

    def __len__(self) -> int:
        """Indexed (holder, block) entries."""
        return sum(len(c) for c in self._contents)

    def snapshot(self) -> IndexSnapshot:
        def name(key: HolderKey) -> tuple[str, int, str]:
            return (key[0].instance, key[0].dp_rank, key[1])

        blocks = {
            name(k): frozenset(c) for k, c in zip(self._holders, self._contents, strict=True) if c
        }
        seqs = {(p.instance, p.dp_rank): s for p, s in self._seq.items()}
        return IndexSnapshot(blocks, frozenset(name(k) for k in self._stale), seqs)

    def _reset(
        self, pub: Publisher, tier: Tier, hashes: tuple[int, ...], parents: tuple[int | None, ...]
    ) -> None:
        """Forget a holder's blocks, trust it again, and store `hashes` (a snapshot) in it."""
        bit = self._bit(pub, tier)
        self._remove(bit, tuple(self._contents[bit]))
        self._set_stale(pub, tier, False)
        self._store(bit, hashes, parents)

    def _mark_stale(self, pub: Publisher) -> None:
        for tier in self._tiers_of[pub]:
            self._set_stale(pub, tier, True)

    def _set_stale(self, pub: Publisher, tier: Tier, stale: bool) -> None:
        key = (pub, tier)
        if (key in self._stale) == stale:
            return
        bit = self._bit(pub, tier)
        if stale:
            self._stale.add(key)
            self._stale_bits |= 1 << bit
        else:
            self._stale.discard(key)
            self._stale_bits &= ~(1 << bit)
        if tier != "rank_hbm":
            for h in self._contents[bit]:
                self._refresh_pool(h)
