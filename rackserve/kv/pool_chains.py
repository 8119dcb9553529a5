"""The pool's stored blocks: one LRU per tier, and each block's stored children, so eviction is
prefix-closed (a tail goes before its parent; a parent with a stored child is never dropped).

A prefix is matched from its first block, so a block whose parent is gone can never be reached:
keeping it would waste the tier. Touching a chain touches it tail first and then its stored
ancestors, so a parent is always at least as recent as its children and LRU order already puts
tails first; the children check keeps that true under leases and suffix lookups too.

LRU order is kept lazily (issue 33): a touch or a commit is logged, and the log is replayed into
the tiers' OrderedDicts only when something reads the order (an eviction, `blocks`) or changes a
block's place otherwise (a move, a detach), or when it grows past `_LOG_LIMIT` live entries. A
touch of a stored chain prefix touches the whole path from the root to its last block (`path(X)`);
an earlier logged path whose last block lies on a later touched path is contained in it, so every
block it touched is touched again later and its entry is dropped unreplayed. Replaying the entries
left, in order, gives exactly the eager order: what a dropped entry did is overwritten by the later
one, and between a log entry and its replay blocks are only added (a detach or move replays first),
so every replayed walk finds the blocks and tiers it found when it was logged. An earlier path that
a later one contains all but its last block of (a prompt that ended inside a block group, which the
next turn fills with another block) keeps that block alone. In an agentic replay each turn touches
its conversation's whole history, so the eager order cost one `move_to_end` per stored block of every
prompt (~144 of them, in a table of millions: 14.5% of a 900 s rack point); lazily a turn costs a
small-set intersection, and the log holds one path per conversation and one block per earlier turn.
The marks on a path (logged paths' last blocks and their parents) are found among its root's marks by
depth when the path is known from its root (`_rooted`), else by asking for each of its blocks.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice, repeat
from operator import attrgetter

from rackserve.kv.pool_limits import POOL_TIERS, PoolTier

_FIRST_CHUNK = 64  # blocks of a tier's LRU front read per chunk by eviction, then doubling
_LOG_LIMIT = 1 << 16  # live log entries (a path per conversation, a block per turn) before a replay anyway
# log entry kinds: [kind, a, b, parent]; kind None once a later path contains the entry's
_PREFIX, _TOUCH, _COMMIT, _ADD = 1, 2, 3, 4


@dataclass(slots=True)
class PyStoredBlock:
    """A block the pool stores. `StoredBlock` is this record as a C type where it is built
    (kv/_poolcore.c: the same fields, equality and repr; made ~2x faster and 16 bytes smaller, which
    counts at millions of blocks), else this class; it is the reference the tests hold the C one to."""

    block_hash: int
    size: int  # actual bytes in Redis
    charge: int  # target bytes counted against the tier
    owner: str
    tier: PoolTier
    parent_hash: int | None  # the block before this one in its chain (None = a chain's root)
    # the pool's link to one of its stored children (PoolChains; the others, where a chain forks, in
    # its _siblings): kept on the parent's record, not in a table of millions keyed by its hash
    child: int | None = field(default=None, compare=False, repr=False)


def py_leading_run(hashes: Sequence[int], hi: int, *tables: Container[int]) -> int:
    """Length of the leading run of hashes[:hi] that are in any of `tables`, by bisection (the run
    is known to be leading: the tables hold prefixes of chains). The reference of the C one. The
    first key is asked alone first: most chains asked about are held nowhere (one probe, not log n)."""
    lo = 0
    if hi > 0:
        h = hashes[0]
        if any(h in t for t in tables):
            lo = 1
        else:
            hi = 0
    while lo < hi:
        mid = (lo + hi) >> 1
        h = hashes[mid]
        if any(h in t for t in tables):
            lo = mid + 1
        else:
            hi = mid
    return lo


try:  # built by `pip install -e .` (setup.py); without a C compiler the Python twins serve
    from rackserve.kv._poolcore import StoredBlock, leading_run
except ImportError:  # pragma: no cover - exercised where no C compiler is
    StoredBlock = PyStoredBlock  # type: ignore[misc,assignment]
    leading_run = py_leading_run


_HASH = attrgetter("block_hash")


class PoolChains:
    def __init__(self, lazy: bool = True) -> None:
        """`lazy`: keep LRU order as a log replayed when read (module docstring); False replays
        every entry at once (the eager order, for tests)."""
        self._lru: dict[PoolTier, OrderedDict[int, StoredBlock]] = {t: OrderedDict() for t in POOL_TIERS}
        self._all: dict[int, StoredBlock] = {}  # every stored block, whatever its tier (one lookup)
        self._hbm = self._lru[POOL_TIERS[0]]
        # a stored block's stored children: one on its record (StoredBlock.child), the others (a
        # chain that forks) here, parent hash -> set. No table entry per stored block.
        self._siblings: dict[int, set[int]] = {}
        self._log: list[list] = []  # order changes not yet applied to the tiers, oldest first
        # a logged path's last block, and that block's parent -> the entry (one entry per block: a
        # newer mark replaces an older one, whose entry then just stays in the log)
        self._marks: dict[int, list] = {}
        # the same marks by the root of their path: root -> {marked block: its depth on the path}. A
        # path known from its root (the simulator's every touch) then finds the marks on it among its
        # root's few (path[depth] == block: a chained hash has one depth and one root) instead of
        # asking for each of its blocks (~115 at the rack point). A path known only in part (a general
        # touch, which walks up to its root when replayed) makes the marks `_loose` until a flush:
        # they are then found by asking for every block, as before.
        self._rooted: dict[int, dict[int, int]] = {}
        self._loose = False
        self._limit = _LOG_LIMIT if lazy else 0
        self._cap = 1024 if lazy else 0  # log length at which dead entries are dropped (or it is replayed)

    # ---- queries -------------------------------------------------------------------------
    def get(self, block_hash: int) -> StoredBlock | None:
        return self._all.get(block_hash)

    def tier_of(self, block_hash: int) -> PoolTier | None:
        block = self._all.get(block_hash)
        return None if block is None else block.tier

    def stored_among(self, hashes: Sequence[int]) -> set[int]:
        return self._all.keys() & hashes

    def stored_prefix(self, hashes: Sequence[int]) -> tuple[int, int]:
        """(blocks in the pool, of which in pool_hbm) at the start of a chain whose i-th hash's
        parent is the (i-1)-th, by bisection: the pool is prefix-closed along a chain and its
        tiers only get slower along it (pool_tiers.py), so both are leading runs (the second
        needs no search while pool_dram holds nothing)."""
        end = leading_run(hashes, len(hashes), self._all)
        if not end or not self._lru[POOL_TIERS[1]]:
            return end, end
        return end, leading_run(hashes, end, self._hbm)

    def blocks(self, tier: PoolTier) -> list[StoredBlock]:
        """A tier's blocks from least to most recently used."""
        self.flush()
        return list(self._lru[tier].values())

    def unordered(self, tier: PoolTier) -> list[StoredBlock]:
        """A tier's blocks in no particular order (no replay of the log)."""
        return list(self._lru[tier].values())

    def count(self, tier: PoolTier) -> int:
        return len(self._lru[tier])

    def children(self, block_hash: int) -> list[StoredBlock]:
        """The stored blocks chained right after `block_hash`."""
        kids = sorted(self._kids(block_hash))
        return [b for k in kids if (b := self.get(k)) is not None]

    def _kids(self, block_hash: int) -> list[int]:
        block = self._all.get(block_hash)
        one = None if block is None else block.child
        if one is None:
            return []
        return [one, *self._siblings.get(block_hash, ())]

    def is_leaf(self, block: StoredBlock, within: PoolTier | None = None) -> bool:
        """No stored child (in tier `within`, or in any tier when None)."""
        h = block.block_hash
        one = block.child
        if within is None or one is None:
            return one is None
        if self.tier_of(one) == within:
            return False
        more = self._siblings.get(h)
        return not more or all(self.tier_of(k) != within for k in more)

    def _link(self, parent: int, child: int) -> None:
        """Record `child` as a stored child of `parent` (a stored block)."""
        record = self._all[parent]
        one = record.child
        if one is None:
            record.child = child
        elif one != child:
            self._siblings.setdefault(parent, set()).add(child)

    def link_chain(self, first_parent: int | None, chain: list[int], blocks: list[StoredBlock]) -> None:
        """Record a committed chain's links: chain[0] under `first_parent` (None: a root), each
        later hash under the one before it (`blocks`: the chain's records, new, so each has no
        child yet: one each, set in a C-level pass)."""
        if first_parent is not None:
            self._link(first_parent, chain[0])
        deque(map(setattr, blocks[:-1], repeat("child"), chain[1:]), maxlen=0)

    def _unlink(self, parent: int, child: int) -> None:
        """Forget `child` as a stored child of `parent`."""
        record = self._all.get(parent)
        if record is not None and record.child == child:
            more = self._siblings.get(parent)
            if more:
                record.child = min(more)
                more.discard(record.child)
                if not more:
                    del self._siblings[parent]
            else:
                record.child = None
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
        self._log.append([_ADD, block.block_hash, None, None])
        self._logged()

    def detach(self, block: StoredBlock) -> None:
        """Take a childless block out of the pool."""
        assert self.is_leaf(block), "a parent leaves before its child"
        self.flush()
        del self._lru[block.tier][block.block_hash]
        del self._all[block.block_hash]
        if block.parent_hash is not None:
            self._unlink(block.parent_hash, block.block_hash)

    def move(self, block: StoredBlock, tier: PoolTier) -> None:
        """Move a block to another tier (as its most recently used); its chain links stay."""
        self.flush()
        del self._lru[block.tier][block.block_hash]
        block.tier = tier
        self._lru[tier][block.block_hash] = block

    def touch(self, hashes: list[int], now: float) -> None:
        """Mark stored blocks of one chain as just used: tail first, then the chain's stored
        ancestors up to its root, so no child is ever more recent than its parent (logged)."""
        if hashes:
            self._log.append([_TOUCH, tuple(hashes), None, None])  # a copy: the caller's list may change
            self._logged()

    def touch_prefix(self, chain: Sequence[int], end: int) -> None:
        """`touch(chain[end - 1:])` for a stored chain prefix: chain[:end] are stored, each hash's
        parent the one before it, so the walk up its ancestors is chain[end - 1], ..., chain[0]
        (then chain[0]'s own ancestors): the path from the root to chain[end - 1] (logged)."""
        if end > 0:
            keys = tuple(chain[:end])  # a copy: the caller's sequence may change before the replay
            self._log_path([_PREFIX, keys, end, None], keys, None)

    def touch_committed(self, chain: list[int], ancestors: Sequence[int] | None) -> None:
        """The order a commit leaves: its new chain (entered its tiers tail first, parent before
        child along it) as most recent, then its stored ancestors: `ancestors`, the path from the
        root to chain[0]'s parent, or found by walking up from chain[0] when None (logged)."""
        more = None if ancestors is None else tuple(ancestors)
        keys = tuple(chain)
        # marks are on stored blocks (a detach replays the log first, which forgets them), and a
        # commit's chain was not stored before it: only its ancestors can bear marks
        self._log_path([_COMMIT, keys, more, None], keys, more, (more,) if more else ())

    def _log_path(self, entry: list, keys: tuple[int, ...], more: tuple[int, ...] | None,
                  marked: tuple[Sequence[int], ...] | None = None) -> None:
        """Log a touch of the path from the root to keys[-1], which passes through `keys` (and
        `more`, the path before them). A logged path ending on one of them is contained in it:
        dropped. One whose last block's parent is on it but not that block (the previous turn's
        prompt ended inside a block group, which this turn's prompt fills) keeps only that block:
        the rest of it is touched again here. An entry is [kind, a, b, parent of its last block].
        `marked`: the parts of the path that may bear marks (None: `keys` and `more`)."""
        marks = self._marks
        root = None if self._loose else self._root_of(keys, more)
        if root is None and not self._loose:
            self._loose = True
            self._rooted.clear()
        if marks:
            if root is not None:  # the marks on the path (its marked parts: `more`, then `keys`)
                m = len(more) if more else 0
                span = m + len(keys) if marked is None else (m if marked else 0)
                found: Iterable[Iterable[int]] = (self._found_rooted(root, keys, more, span),)
            else:
                if marked is None:
                    marked = (keys, more) if more else (keys,)
                found = (marks.keys() & part for part in marked)
            for hs in found:
                for h in hs:
                    old = marks.pop(h)
                    kind = old[0]
                    if kind is None:
                        continue  # a mark left by an entry already dropped
                    last = old[1] if kind == _ADD else old[1][-1]
                    if h == last:
                        old[:] = (None, None, None, None)
                    elif h == old[3]:
                        old[:] = (_ADD, last, None, None)  # its last block alone, where it was
        last = keys[-1]
        if len(keys) > 1:
            parent = keys[-2]
        elif more:
            parent = more[-1]
        else:
            block = self._all.get(last)
            parent = None if block is None else block.parent_hash
        entry[3] = parent
        self._log.append(entry)
        marks[last] = entry
        if parent is not None:
            marks[parent] = entry
        if root is not None:
            depths = self._rooted.get(root)
            if depths is None:
                depths = self._rooted[root] = {}
            n = len(keys) + (len(more) if more else 0)
            depths[last] = n - 1
            if parent is not None:
                depths[parent] = n - 2
        self._logged()

    def _root_of(self, keys: tuple[int, ...], more: tuple[int, ...] | None) -> int | None:
        """The root of a logged path when it is known from its root: `more` (or else `keys`) starts at
        a block without a parent. None: the path is known only in part."""
        first = more[0] if more else keys[0]
        block = self._all.get(first)
        return first if block is not None and block.parent_hash is None else None

    def _found_rooted(self, root: int, keys: tuple[int, ...], more: tuple[int, ...] | None,
                      span: int) -> list[int]:
        """The marked blocks among the first `span` of the path `more` + `keys` from `root`, taken
        off the root's marks (the caller takes them off `_marks`)."""
        depths = self._rooted.get(root)
        if not depths:
            return []
        m = len(more) if more else 0
        out = [h for h, d in depths.items() if d < span and (more[d] if d < m else keys[d - m]) == h]  # type: ignore[index]
        for h in out:
            del depths[h]
        return out

    def _logged(self) -> None:
        log = self._log
        if len(log) <= self._cap:
            return
        live = [e for e in log if e[0] is not None]
        if len(live) > self._limit:
            self.flush()
        else:
            self._log = live
            self._cap = max(2 * len(live), 1024)

    def flush(self) -> None:
        """Replay the logged order changes into the tiers, oldest first."""
        log = self._log
        if not log:
            return
        self._log = []
        self._marks.clear()
        self._rooted.clear()
        self._loose = False
        self._cap = 1024 if self._limit else 0
        stored, lru = self._all, self._lru
        for kind, a, b, _ in log:
            if kind == _PREFIX:
                self._touch_prefix_now(a, b)
            elif kind == _COMMIT:
                for h in reversed(a):
                    lru[stored[h].tier].move_to_end(h)
                if b is not None:
                    self._touch_prefix_now(b, len(b))
                else:
                    self._touch_ancestors(a[0])
            elif kind == _TOUCH:
                for h in reversed(a):
                    block = stored.get(h)
                    if block is not None:
                        lru[block.tier].move_to_end(h)
                self._touch_ancestors(a[0])
            elif kind == _ADD:
                block = stored.get(a)
                if block is not None:
                    lru[block.tier].move_to_end(a)

    def _touch_prefix_now(self, chain: Sequence[int], end: int) -> None:
        """The eager touch_prefix. The tiers along a stored chain are a pool_hbm run then a
        pool_dram run (pool_tiers.py), so it is two C-level passes of move_to_end."""
        if end <= 0:
            return
        dram = self._lru[POOL_TIERS[1]]
        n_hbm = leading_run(chain, end, self._hbm) if dram else end
        deque(map(dram.move_to_end, reversed(chain[n_hbm:end])), maxlen=0)
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
        self._log = []
        self._marks.clear()
        self._rooted.clear()
        self._loose = False
        for tier in POOL_TIERS:
            self._lru[tier].clear()
        self._all.clear()
        self._siblings.clear()

    # ---- eviction order --------------------------------------------------------------------
    def victims(self, tier: PoolTier, keep: Callable[[int], bool], demote: bool) -> Iterator[StoredBlock]:
        """A tier's blocks that may go, least recently used first and prefix-closed: a block
        comes only once its children are gone (from this tier when it is demoted, from the pool
        when it is dropped). The caller moves or detaches each block before asking for the next;
        `keep(hash)` protects a block (a read lease)."""
        self.flush()
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
