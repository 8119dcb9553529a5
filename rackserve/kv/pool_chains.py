"""The pool's stored blocks: one LRU per tier, and each block's stored children, so eviction is
prefix-closed (a tail goes before its parent; a parent with a stored child is never dropped).

A prefix is matched from its first block, so a block whose parent is gone can never be reached:
keeping it would waste the tier. Touching a chain touches it tail first and then its stored
ancestors, so a parent is always at least as recent as its children and LRU order already puts
tails first; the children check keeps that true under leases and suffix lookups too.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Container, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from operator import attrgetter

from rackserve.kv.pool_limits import POOL_TIERS, PoolTier

_FIRST_CHUNK = 64  # blocks of a tier's LRU front read per chunk by eviction, then doubling


@dataclass(slots=True)
class StoredBlock:
    block_hash: int
    size: int  # actual bytes in Redis
    charge: int  # target bytes counted against the tier
    owner: str
    tier: PoolTier
    parent_hash: int | None  # the block before this one in its chain (None = a chain's root)


_HASH = attrgetter("block_hash")


class PoolChains:
    def __init__(self) -> None:
        self._lru: dict[PoolTier, OrderedDict[int, StoredBlock]] = {t: OrderedDict() for t in POOL_TIERS}
        self._all: dict[int, StoredBlock] = {}  # every stored block, whatever its tier (one lookup)
        self._hbm = self._lru[POOL_TIERS[0]]
        # parent hash -> one of its stored children; its other stored children (a chain that forks)
        # in _siblings. One int per parent instead of a set: no object per stored block.
        self._child: dict[int, int] = {}
        self._siblings: dict[int, set[int]] = {}

    # ---- queries -------------------------------------------------------------------------
    def get(self, block_hash: int) -> StoredBlock | None:
        return self._all.get(block_hash)

    def tier_of(self, block_hash: int) -> PoolTier | None:
        block = self._all.get(block_hash)
        return None if block is None else block.tier

    def stored_prefix(self, hashes: Sequence[int]) -> tuple[int, int]:
        """(blocks in the pool, of which in pool_hbm) at the start of a chain whose i-th hash's
        parent is the (i-1)-th, by bisection: the pool is prefix-closed along a chain and its
        tiers only get slower along it (pool_tiers.py), so both are leading runs."""
        end = _leading_run(hashes, len(hashes), self._all)
        return end, _leading_run(hashes, end, self._hbm)

    def blocks(self, tier: PoolTier) -> list[StoredBlock]:
        """A tier's blocks from least to most recently used."""
        return list(self._lru[tier].values())

    def count(self, tier: PoolTier) -> int:
        return len(self._lru[tier])

    def children(self, block_hash: int) -> list[StoredBlock]:
        """The stored blocks chained right after `block_hash`."""
        kids = sorted(self._kids(block_hash))
        return [b for k in kids if (b := self.get(k)) is not None]

    def _kids(self, block_hash: int) -> list[int]:
        one = self._child.get(block_hash)
        if one is None:
            return []
        return [one, *self._siblings.get(block_hash, ())]

    def is_leaf(self, block: StoredBlock, within: PoolTier | None = None) -> bool:
        """No stored child (in tier `within`, or in any tier when None)."""
        h = block.block_hash
        one = self._child.get(h)
        if within is None or one is None:
            return one is None
        if self.tier_of(one) == within:
            return False
        more = self._siblings.get(h)
        return not more or all(self.tier_of(k) != within for k in more)

    def _link(self, parent: int, child: int) -> None:
        """Record `child` as a stored child of `parent`."""
        one = self._child.setdefault(parent, child)
        if one != child:
            self._siblings.setdefault(parent, set()).add(child)

    def link_chain(self, first_parent: int | None, chain: list[int]) -> None:
        """Record a committed chain's links: chain[0] under `first_parent` (None: a root), each
        later hash under the one before it (new parents: one child each, in one C-level update)."""
        if first_parent is not None:
            self._link(first_parent, chain[0])
        self._child.update(zip(chain[:-1], chain[1:], strict=True))

    def _unlink(self, parent: int, child: int) -> None:
        """Forget `child` as a stored child of `parent`."""
        if self._child.get(parent) == child:
            more = self._siblings.get(parent)
            if more:
                self._child[parent] = min(more)
                more.discard(self._child[parent])
                if not more:
                    del self._siblings[parent]
            else:
                del self._child[parent]
            return
        more = self._siblings.get(parent)
        if more is not None:
            more.discard(child)
            if not more:
                del self._siblings[parent]

    # ---- changes -------------------------------------------------------------------------
    def add(self, block: StoredBlock) -> None:
        """Store a block; it enters its tier as most recently used."""
        assert block.parent_hash is None or block.parent_hash in self._all, "orphan block"
        self._lru[block.tier][block.block_hash] = block
        self._all[block.block_hash] = block
        if block.parent_hash is not None:
            self._link(block.parent_hash, block.block_hash)

    def detach(self, block: StoredBlock) -> None:
        """Take a childless block out of the pool."""
        assert self.is_leaf(block), "a parent leaves before its child"
        del self._lru[block.tier][block.block_hash]
        del self._all[block.block_hash]
        if block.parent_hash is not None:
            self._unlink(block.parent_hash, block.block_hash)

    def move(self, block: StoredBlock, tier: PoolTier) -> None:
        """Move a block to another tier (as its most recently used); its chain links stay."""
        del self._lru[block.tier][block.block_hash]
        block.tier = tier
        self._lru[tier][block.block_hash] = block

    def touch(self, hashes: list[int], now: float) -> None:
        """Mark stored blocks of one chain as just used: tail first, then the chain's stored
        ancestors up to its root, so no child is ever more recent than its parent.
        (Inlined per block: this runs over every block of every simulated prompt.)"""
        if not hashes:
            return
        stored, lru = self._all, self._lru
        for h in reversed(hashes):
            block = stored.get(h)
            if block is not None:
                lru[block.tier].move_to_end(h)
        self._touch_ancestors(hashes[0])

    def touch_prefix(self, chain: Sequence[int], end: int) -> None:
        """`touch(chain[end - 1:])` for a stored chain prefix: chain[:end] are stored, each hash's
        parent the one before it, so the walk up its ancestors is chain[end - 1], ..., chain[0]
        (then chain[0]'s own ancestors). The tiers along it are a pool_hbm run then a pool_dram run
        (pool_tiers.py), so it is two C-level passes of move_to_end instead of one lookup per block."""
        if end <= 0:
            return
        n_hbm = _leading_run(chain, end, self._hbm)
        deque(map(self._lru[POOL_TIERS[1]].move_to_end, reversed(chain[n_hbm:end])), maxlen=0)
        deque(map(self._hbm.move_to_end, reversed(chain[:n_hbm])), maxlen=0)
        self._touch_ancestors(chain[0])

    def _touch_ancestors(self, block_hash: int) -> None:
        """Move the stored ancestors of `block_hash` to their tiers' ends, parent first."""
        stored, lru = self._all, self._lru
        block = stored.get(block_hash)
        parent = None if block is None else block.parent_hash
        while parent is not None:
            block = stored.get(parent)
            if block is None:
                return
            lru[block.tier].move_to_end(parent)
            parent = block.parent_hash

    def clear(self) -> None:
        for tier in POOL_TIERS:
            self._lru[tier].clear()
        self._all.clear()
        self._child.clear()
        self._siblings.clear()

    # ---- eviction order --------------------------------------------------------------------
    def victims(self, tier: PoolTier, keep: Callable[[int], bool], demote: bool) -> Iterator[StoredBlock]:
        """A tier's blocks that may go, least recently used first and prefix-closed: a block
        comes only once its children are gone (from this tier when it is demoted, from the pool
        when it is dropped). The caller moves or detaches each block before asking for the next;
        `keep(hash)` protects a block (a read lease)."""
        within = tier if demote else None
        waiting: set[int] = set()  # passed over while they had children
        for block in self._front(tier):
            if block.tier != tier or self.get(block.block_hash) is not block or keep(block.block_hash):
                continue
            if not self.is_leaf(block, within):
                waiting.add(block.block_hash)
                continue
            yield block
            parent = block.parent_hash  # its parent may have just become a leaf
            while parent in waiting:
                up = self._lru[tier].get(parent)
                if up is None or not self.is_leaf(up, within):
                    break
                waiting.discard(parent)
                parent = up.parent_hash
                yield up

    def _front(self, tier: PoolTier) -> Iterator[StoredBlock]:
        """The tier's blocks in LRU order as they stood at the first call, read in growing chunks
        (an eviction looks at a few of them; copying a tier of millions per eviction did not pay).
        Exact while blocks only leave the tier meanwhile (eviction adds none to the tier it
        walks): the blocks looked at and still there are then the tier's first `passed`."""
        lru, seen, passed, size = self._lru[tier], [], 0, _FIRST_CHUNK
        while True:
            chunk = list(islice(lru.values(), passed, passed + size))
            if not chunk:
                return
            yield from chunk
            seen += map(_HASH, chunk)
            passed = sum(map(lru.__contains__, seen))  # earlier ones may have gone since, too
            size *= 2

def _leading_run(hashes: Sequence[int], hi: int, members: Container[int]) -> int:
    """Length of the leading run of hashes[:hi] that are in `members`, by bisection (the run is
    known to be leading: members are prefix-closed along the chain)."""
    lo = 0
    while lo < hi:
        mid = (lo + hi) >> 1
        if hashes[mid] in members:
            lo = mid + 1
        else:
            hi = mid
    return lo
