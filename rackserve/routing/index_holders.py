"""PrefixIndex's holder tables: which holders (one bit each) hold each block, kept by stores and
removals, with the general index's parent and orphan bookkeeping.

Per-block work runs in C (map / compress / dict.update): one store or removal per KV event. The
general index records each block's parent and counts orphans (rackserve.routing.closure) so lookups
know when binary search is exact; a `closed_chains` index (the simulator's: every holder stays
prefix-closed by construction) keeps only the holder bits. A base of PrefixIndex (index.py), which
owns the state read here (declared below); pool holders' extra tables are in index_pool.py.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import compress, filterfalse, repeat
from operator import and_, not_, or_

from rackserve.kv.events import Publisher, Tier
from rackserve.routing.closure import UNKNOWN_PARENT, PrefixClosure
from rackserve.routing.index_pool import IndexPool
from rackserve.routing.view import RankId

HolderKey = tuple[Publisher, Tier]


class IndexHolders(IndexPool):
    _closed_chains: bool
    _bit_of: dict[HolderKey, int]
    _holders: list[HolderKey]
    _contents: list[set[int]]
    _closures: list[PrefixClosure | None]
    _rank_key: dict[int, RankId]
    _rank: dict[int, int]
    _parent: dict[int, int | None]
    _unknown: set[int]
    _stale: set[HolderKey]

    def _bit(self, pub: Publisher, tier: Tier) -> int:
        key = (pub, tier)
        bit = self._bit_of.get(key)
        if bit is not None:
            return bit
        bit = len(self._holders)
        self._bit_of[key] = bit
        self._holders.append(key)
        self._contents.append(set())
        self._closures.append(PrefixClosure() if tier == "rank_hbm" else None)
        if tier == "rank_hbm":
            self._rank_key[bit] = (pub.instance, pub.dp_rank)
        else:
            self._pool_bits[tier] |= 1 << bit
        if key in self._stale:
            self._stale_bits |= 1 << bit
        return bit

    def _store(self, bit: int, hashes: Sequence[int], parents: Sequence[int | None]) -> None:
        # Per-block work runs in C (map / compress / dict.update): one store per KV event.
        # `parents` aligns with `hashes`, or is empty in a closed_chains index (it keeps none).
        if self._unknown and not self._unknown.isdisjoint(hashes):
            self._learn_parents(hashes, parents)
        content, flag, closure = self._contents[bit], 1 << bit, self._closures[bit]
        if content.isdisjoint(hashes):
            blocks, given = list(hashes), list(parents)
        else:
            fresh = list(map(not_, map(content.__contains__, hashes)))
            blocks, given = list(compress(hashes, fresh)), list(compress(parents, fresh))
            if not blocks:
                return
        content.update(blocks)
        if self._closed_chains:
            self._store_closed(bit, blocks, given, flag, closure is None)
            return
        kept = list(map(self._parent.setdefault, blocks, given))  # the first-known parent stays
        if UNKNOWN_PARENT in kept:
            self._unknown.update(b for b, k in zip(blocks, kept, strict=True) if k == UNKNOWN_PARENT)
        if closure is None:
            self._pool_add(blocks, kept, flag)
            return
        table = self._rank
        news = map(or_, map(table.get, blocks, repeat(0)), repeat(flag))
        table.update(zip(blocks, news, strict=True))
        self._orphans += closure.added_many(blocks, kept, content.__contains__)

    def _store_closed(self, bit: int, blocks: list[int], parents: list[int | None], flag: int, pool: bool) -> None:
        """`_store` of new blocks without orphan or parent bookkeeping (closed_chains)."""
        if pool:
            self._pool_add(blocks, parents, flag)
            return
        table = self._rank
        table.update(zip(blocks, map(or_, map(table.get, blocks, repeat(0)), repeat(flag)), strict=True))

    def _remove(self, bit: int, hashes: Sequence[int]) -> None:
        content, flag, closure = self._contents[bit], 1 << bit, self._closures[bit]
        blocks = list(compress(hashes, map(content.__contains__, hashes)))
        if not blocks:
            return
        content.difference_update(blocks)
        if self._closed_chains:
            self._remove_closed(blocks, flag, closure is None)
            return
        parents = list(map(self._parent.__getitem__, blocks))
        if closure is None:
            self._pool_remove(blocks, parents, flag)
        else:
            table = self._rank  # per-block work in C: the holders left, then drop the empty ones
            lefts = list(map(and_, map(table.__getitem__, blocks), repeat(~flag)))
            table.update(compress(zip(blocks, lefts, strict=True), lefts))
            deque(map(table.__delitem__, compress(blocks, map(not_, lefts))), maxlen=0)
            self._orphans += closure.removed_many(blocks, parents, content.__contains__)
        rank, pool, parent_of = self._rank, self._pool_mask, self._parent
        gone = list(filterfalse(pool.__contains__, filterfalse(rank.__contains__, blocks)))  # held by nobody
        deque(map(parent_of.__delitem__, gone), maxlen=0)
        if self._unknown:
            self._unknown.difference_update(gone)

    def _remove_closed(self, blocks: list[int], flag: int, pool: bool) -> None:
        """`_remove` without orphan or parent bookkeeping (closed_chains)."""
        if pool:
            self._pool_remove(blocks, [], flag)
            return
        table = self._rank
        lefts = list(map(and_, map(table.__getitem__, blocks), repeat(~flag)))
        table.update(compress(zip(blocks, lefts, strict=True), lefts))
        deque(map(table.__delitem__, compress(blocks, map(not_, lefts))), maxlen=0)

    def _learn_parents(self, hashes: Sequence[int], parents: Sequence[int | None]) -> None:
        """An event names the parent of blocks held with an unknown one (from a snapshot): every
        holder takes the block out and back in with its parent, so its closure counts it right
        (the unknown parent no longer marks it an orphan forever)."""
        for h, parent in zip(hashes, parents, strict=True):
            if h not in self._unknown or parent == UNKNOWN_PARENT:
                continue
            bits = self._rank.get(h, 0) | self._pool_mask.get(h, 0)
            holders = [b for b in range(bits.bit_length()) if bits >> b & 1]
            for b in holders:
                self._remove(b, (h,))
            self._parent[h] = parent
            self._unknown.discard(h)
            for b in holders:
                self._store(b, (h,), (parent,))
            if not holders:
                del self._parent[h]
