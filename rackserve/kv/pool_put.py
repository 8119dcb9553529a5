"""The pool's two-phase put (pool_tiers.py's rules): `reserve` books space for blocks not stored
yet, `commit` makes them visible (a block only after its parent), `abort` and expiry release them.

A base of PoolTiers, which owns the state these methods read and write (declared below) and the
space they book (`_allocate`, pool_tiers.py); moved here unchanged from pool_tiers.py.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import attrgetter, not_, sub

from rackserve.kv.pool_chains import PoolChains, StoredBlock
from rackserve.kv.pool_leases import Leases
from rackserve.kv.pool_limits import POOL_TIERS, PoolLimits, PoolTier
from rackserve.kv.pool_messages import BlockPut, PoolCounters, PutStatus, Reservation
from rackserve.kv.pool_outbox import PoolOutbox

_TIER_INDEX = {t: i for i, t in enumerate(POOL_TIERS)}
_CHARGE, _TXN, _BLOCK, _PARENT = attrgetter("charge"), attrgetter("txn"), attrgetter("block"), attrgetter("parent_hash")


@dataclass(slots=True)
class _Pending:
    txn: int
    block: StoredBlock
    expires_at: float
    written: bool = False  # committed by its writer, waiting for its parent to be stored


@dataclass(slots=True)
class _ChainPut:
    """A put reserved by `_reserve_chain`, pending as one record: `_pending` maps each of its hashes
    to it (one object per put, not a StoredBlock and a _Pending per block). Until its one-pass commit
    nothing else changes it: a general path that would change or read its blocks one by one first
    turns it into the per-block entries `_reserve_chain` used to make (`_explode`), so everything
    that follows is as before. Its blocks' parents but the first (each the block before it, pending
    itself) are pinned only then: a pending block is no eviction candidate, so nothing reads those
    pins meanwhile, and the one-pass commit would take them off again."""
    txn: int
    hashes: list[int]
    sizes: list[int]
    charges: list[int]
    owner: str
    tier: PoolTier
    parent_hash: int | None  # the block before hashes[0]
    expires_at: float
    total: int  # sum(charges)


def _pending_tier(pending: _Pending | _ChainPut) -> PoolTier:
    """The tier a pending block was booked in (one entry of `_pending`)."""
    return pending.tier if type(pending) is _ChainPut else pending.block.tier


class PoolPut:
    limits: PoolLimits
    counters: PoolCounters
    _chains: PoolChains
    _leases: Leases
    _used: dict[PoolTier, int]
    _high: dict[PoolTier, float]
    _reserved: dict[PoolTier, int]
    _actual_used: int
    _pending: dict[int, _Pending | _ChainPut]
    _pinned: Counter[int]
    _waiting: dict[int, set[int]]
    _txn_of: dict[int, int]
    _txns: dict[int, dict[int, None]]
    _txn_heap: list[tuple[float, int]]
    _outbox: PoolOutbox
    forgotten: int  # blocks that left the pool after it knew them (PoolTiers counts them)
    # and, from PoolTiers: expire(now), _allocate(charge, size, first) -> tier, _new_id()

    def reserve(self, blocks: list[BlockPut], owner: str, now: float, parent_hash: int | None = None) -> Reservation:
        """Book space for the blocks not stored yet. `parent_hash` precedes blocks[0] in its chain."""
        self.expire(now)
        txn, expires_at = self._new_id(), now + self.limits.lease_s
        default = self.limits.block_charge_bytes
        fast = self._reserve_chain([b.block_hash for b in blocks], [b.size for b in blocks],
                                   [b.target_size or default or b.size for b in blocks], owner, now, txn,
                                   parent_hash, expires_at)
        return fast if fast is not None else self._reserve_each(blocks, owner, now, txn, parent_hash, expires_at)

    def reserve_chain(self, hashes: Sequence[int], size: int, last_size: int, owner: str, now: float,
                      parent_hash: int | None = None) -> Reservation:
        """`reserve` of a chain whose blocks all weigh `size` bytes but the last (`last_size`), with
        the pool's default charge, without a BlockPut per block on the common path (the simulator's
        every prompt)."""
        self.expire(now)
        txn, expires_at = self._new_id(), now + self.limits.lease_s
        n = len(hashes)
        sizes = [size] * n
        if n:
            sizes[-1] = last_size
        default = self.limits.block_charge_bytes
        charges = [default] * n if default else sizes
        fast = self._reserve_chain(list(hashes), sizes, charges, owner, now, txn, parent_hash, expires_at)
        if fast is not None:
            return fast
        blocks = list(map(BlockPut, hashes, sizes))
        return self._reserve_each(blocks, owner, now, txn, parent_hash, expires_at)

    def _reserve_each(self, blocks: list[BlockPut], owner: str, now: float, txn: int, parent_hash: int | None,
                      expires_at: float) -> Reservation:
        """The general put: block by block (exists, pending, orphan, eviction, no space)."""
        statuses: list[PutStatus] = []
        tiers: list[PoolTier | None] = []
        booked: list[int] = []
        for i, put in enumerate(blocks):
            parent = parent_hash if i == 0 else blocks[i - 1].block_hash
            status, tier = self._reserve_one(put, owner, now, txn, parent, expires_at)
            statuses.append(status)
            tiers.append(tier)
            if status == "reserved":
                booked.append(put.block_hash)
        self.counters.puts += 1
        self.counters.put_blocks += len(blocks)
        if booked:
            self._txns[txn] = dict.fromkeys(booked)
            heapq.heappush(self._txn_heap, (expires_at, txn))
        return Reservation(txn, tuple(statuses), tuple(tiers), expires_at)

    def _reserve_chain(self, hashes: list[int], sizes: list[int], charges: list[int], owner: str, now: float,
                       txn: int, parent_hash: int | None, expires_at: float) -> Reservation | None:
        """The common put in one pass (the simulator's every prompt): all blocks new, their parent
        known and their tier below its high watermark with all of them, so `_reserve_one` would
        reserve each in the parent's tier without evicting. None: take the general path."""
        pending_of, stored = self._pending, self._chains._all
        if not hashes or not (pending_of.keys().isdisjoint(hashes) and stored.keys().isdisjoint(hashes)):
            return None
        first = 0
        if parent_hash is not None:
            known = pending_of.get(parent_hash)
            if known is not None:
                parent_tier = _pending_tier(known)
            else:
                block = stored.get(parent_hash)
                if block is None:
                    return None
                parent_tier = block.tier
            first = _TIER_INDEX[parent_tier]
        tier = POOL_TIERS[first]
        total, size = sum(charges), sum(sizes)
        if (self._used[tier] + total > self._high[tier]
                or self._actual_used + size > self.limits.high_watermark * self.limits.budget_bytes):
            return None
        # the hashes are new to `_pending`: they are distinct iff it grows by all of them (no set built)
        n, before = len(hashes), len(pending_of)
        put = _ChainPut(txn, hashes, sizes, charges, owner, tier, parent_hash, expires_at, total)
        pending_of.update(dict.fromkeys(hashes, put))
        if len(pending_of) != before + n:  # a hash twice: the general path (nothing else done yet)
            deque(map(pending_of.pop, hashes, repeat(None)), maxlen=0)
            return None
        self._pinned[parent_hash] += 1  # stays where it is until its child commits (the others: _ChainPut)
        self._used[tier] += total
        self._actual_used += size
        self._reserved[tier] += total
        self.counters.puts += 1
        self.counters.put_blocks += len(hashes)
        self._txns[txn] = dict.fromkeys(hashes)
        heapq.heappush(self._txn_heap, (expires_at, txn))
        return Reservation(txn, ("reserved",) * len(hashes), (tier,) * len(hashes), expires_at)

    def _reserve_one(self, put: BlockPut, owner: str, now: float, txn: int, parent: int | None,
                     expires_at: float) -> tuple[PutStatus, PoolTier | None]:
        # per block of every put (the simulator's hot path): lookups bound to locals
        h, chains, pending_of = put.block_hash, self._chains, self._pending
        existing = chains.tier_of(h)
        if existing is not None:
            return "exists", existing
        pending = pending_of.get(h)
        if pending is not None:
            return "pending", _pending_tier(pending)
        first = 0  # _tier_after(parent), found with the parent's is_known check
        if parent is not None:
            known = pending_of.get(parent)
            parent_tier = _pending_tier(known) if known is not None else chains.tier_of(parent)
            if parent_tier is None:
                return "no_space", None  # an orphan: nothing could reach it
            first = _TIER_INDEX[parent_tier]
        charge = put.target_size or self.limits.block_charge_bytes or put.size
        self._pinned[parent] += 1  # its parent stays where it is until it commits (or is released)
        tier = self._allocate(charge, put.size, first)
        if tier is None:
            self._unpin(parent)
            self.counters.alloc_failures += 1
            return "no_space", None
        block = StoredBlock(h, put.size, charge, owner, tier, parent)
        pending_of[h] = _Pending(txn, block, expires_at)
        self._reserved[tier] += charge
        return "reserved", tier

    def commit(self, txn: int, now: float, hashes: list[int] | None = None,
               ancestors: Sequence[int] = ()) -> tuple[int, ...]:
        """Make a reservation's blocks visible (they enter their tier as most recently used):
        all of them, or only `hashes` (a writer may commit in parts; the rest stay reserved).
        A block is stored only after its parent: one whose parent is still being written waits
        (written) and is stored with it, or released if the parent never comes; one whose
        parent is gone is released. Returns this reservation's hashes stored now; one that
        expired first commits nothing (the caller's bytes are then orphans; see `is_known`).
        `ancestors`: the stored chain before the reservation's first block, root first, when the
        caller knows it (the simulator): the LRU refresh of the ancestors then needs no walk."""
        self.expire(now)
        booked = self._txns.get(txn)
        if booked is None:
            return ()
        if hashes is None:
            chain = self._commit_chain(txn, booked, now, ancestors)
            if chain is not None:
                return chain
        wanted = None if hashes is None else set(hashes)
        stored: list[int] = []
        pending_of, tier_of = self._pending, self._chains.tier_of
        for h in booked:  # a one-pass put's record, as per-block entries (the loop below changes them)
            put = pending_of.get(h)
            if type(put) is _ChainPut:
                self._explode(put)
        for h in list(booked) if wanted is None else [h for h in booked if h in wanted]:
            pending = pending_of.get(h)
            parent = pending.block.parent_hash if pending else None
            if pending is None or pending.txn != txn:
                booked.pop(h, None)
            elif parent is None or tier_of(parent) is not None:
                stored += self._store(h, now)
            elif parent in pending_of:  # its parent is being written: it goes in with it
                pending.written = True
                self._waiting.setdefault(parent, set()).add(h)
            else:  # its parent is gone: it could never be matched
                self._release_pending(self._take_pending(h))
        self._chains.touch(stored, now)
        mine = tuple(h for h in stored if self._txn_of.pop(h) == txn)
        self._drop_txn_if_done(txn)
        return mine

    def _commit_chain(self, txn: int, booked: dict[int, None], now: float,
                      ancestors: Sequence[int] = ()) -> tuple[int, ...] | None:
        """The common commit in one pass: a whole reservation that is one chain whose first
        parent is stored, nobody waiting on anything; the general loop would store its blocks in
        order (each parent just before its child) and touch them tail first, so they enter their
        tiers tail first here, and their events go out one run per tier. None (nothing done):
        take the general path."""
        if self._waiting or not booked:
            return None
        pending_of, chains = self._pending, self._chains
        put = pending_of.get(next(iter(booked)))
        if type(put) is _ChainPut:
            return self._commit_put(put, txn, booked, ancestors)
        chain = list(booked)
        items = list(map(pending_of.get, chain))
        if not all(items) or not all(map(txn.__eq__, map(_TXN, items))):  # all(): no dataclass __eq__ per item
            return None
        blocks = list(map(_BLOCK, items))
        parents = list(map(_PARENT, blocks))
        if parents[1:] != chain[:-1]:
            return None
        first = parents[0]
        if first is not None and chains.tier_of(first) is None:
            return None
        deque(map(pending_of.__delitem__, chain), maxlen=0)
        self._unpin_all(parents)
        tier = blocks[0].tier
        if blocks[-1].tier == tier:  # one tier (tiers only slow down along a chain): runs in C
            self._reserved[tier] -= sum(map(_CHARGE, blocks))
            chains._lru[tier].update(zip(reversed(chain), reversed(blocks), strict=True))
        else:
            reserved, lru = self._reserved, chains._lru
            for block in blocks:
                reserved[block.tier] -= block.charge
            for block in reversed(blocks):  # PoolChains.add without its orphan check (checked above)
                lru[block.tier][block.block_hash] = block
        chains._all.update(zip(chain, blocks, strict=True))
        chains.link_chain(first, chain, blocks)  # each parent but the first is new: one child each
        self._emit_stored(blocks, chain)
        self.counters.committed_blocks += len(items)
        booked.clear()
        chains.touch_committed(chain, ancestors if ancestors and ancestors[-1] == first else None)
        del self._txns[txn]
        return tuple(chain)

    def _commit_put(self, put: _ChainPut, txn: int, booked: dict[int, None],
                    ancestors: Sequence[int]) -> tuple[int, ...] | None:
        """`_commit_chain` of a put still pending as its record: its blocks are all pending under
        it (nothing changes them one by one before `_explode`), one chain in one tier, and their
        StoredBlocks are made here, as `_reserve_chain` made them before."""
        chain, first, chains = put.hashes, put.parent_hash, self._chains
        if put.txn != txn or len(booked) != len(chain) or (first is not None and first not in chains._all):
            return None
        deque(map(self._pending.__delitem__, chain), maxlen=0)
        self._unpin(first)
        tier = put.tier
        blocks = list(map(StoredBlock, chain, put.sizes, put.charges, repeat(put.owner), repeat(tier),
                          [first, *chain[:-1]]))
        self._reserved[tier] -= put.total
        chains._lru[tier].update(zip(reversed(chain), reversed(blocks), strict=True))
        chains._all.update(zip(chain, blocks, strict=True))
        chains.link_chain(first, chain, blocks)  # each parent but the first is new: one child each
        self._outbox.emit_run(tier, chain, first)
        self.counters.committed_blocks += len(chain)
        booked.clear()
        chains.touch_committed(chain, ancestors if ancestors and ancestors[-1] == first else None)
        del self._txns[txn]
        return tuple(chain)

    def _explode(self, put: _ChainPut) -> None:
        """Turn a one-pass put's record into the per-block entries (and the pins of its parents
        but the first) that `_reserve_chain` made before records: every hash of it is pending
        under it, nothing of it having changed since it was reserved."""
        hashes = put.hashes
        self._pinned.update(hashes[:-1])
        blocks = map(StoredBlock, hashes, put.sizes, put.charges, repeat(put.owner), repeat(put.tier),
                     [put.parent_hash, *hashes[:-1]])
        self._pending.update(zip(hashes, map(_Pending, repeat(put.txn), blocks, repeat(put.expires_at)), strict=True))

    def _emit_stored(self, blocks: list[StoredBlock], chain: list[int]) -> None:
        """`stored` events of a committed chain: one run per stretch of blocks in one tier."""
        if blocks[0].tier == blocks[-1].tier:  # one tier, one run
            self._outbox.emit_run(blocks[0].tier, chain, blocks[0].parent_hash)
            return
        start = 0
        for i in range(1, len(blocks) + 1):
            if i == len(blocks) or blocks[i].tier != blocks[start].tier:
                self._outbox.emit_run(blocks[start].tier, chain[start:i], blocks[start].parent_hash)
                start = i

    def _store(self, block_hash: int, now: float) -> list[int]:
        """Store a written block and then the written children that waited for it."""
        out, todo = [], [block_hash]
        reserved, add, emit, txn_of, waiting = (self._reserved, self._chains.add, self._outbox.emit, self._txn_of,
                                                  self._waiting)
        while todo:
            h = todo.pop()
            pending = self._take_pending(h)
            block = pending.block
            reserved[block.tier] -= block.charge
            add(block)
            emit("stored", block.tier, h, block.parent_hash)
            txn_of[h] = pending.txn
            out.append(h)
            if waiting:
                todo += sorted(waiting.pop(h, ()))
        self.counters.committed_blocks += len(out)
        return out

    def _drop_txn_if_done(self, txn: int) -> None:
        if not self._txns.get(txn, True):  # nothing of it is reserved any more
            del self._txns[txn]

    def store(self, blocks: list[BlockPut], owner: str, now: float, parent_hash: int | None = None) -> Reservation:
        """Reserve and commit at once (the simulator has no bytes to move in between)."""
        reservation = self.reserve(blocks, owner, now, parent_hash)
        self.commit(reservation.txn, now)
        return reservation

    def abort(self, txn: int) -> tuple[int, ...]:
        """Release a reservation (the caller could not write the bytes). Returns its hashes."""
        hashes = self._txns.pop(txn, {})
        released = [h for h in hashes if h in self._pending and self._pending[h].txn == txn]
        for h in released:
            if h in self._pending:  # not released already with a parent
                self._release_pending(self._take_pending(h))
        return tuple(released)

    def _take_pending(self, block_hash: int) -> _Pending:
        if type(self._pending[block_hash]) is _ChainPut:  # its blocks one by one from now on
            self._explode(self._pending[block_hash])
        pending = self._pending.pop(block_hash)
        parent = pending.block.parent_hash
        self._unpin(parent)
        booked = self._txns.get(pending.txn)
        if booked is not None:
            booked.pop(block_hash, None)
        if self._waiting:
            waiting = self._waiting.get(parent)  # type: ignore[arg-type]
            if waiting is not None:
                waiting.discard(block_hash)
        return pending

    def _unpin_all(self, parents: list[int | None]) -> None:
        """`_unpin` of distinct parents, in C-level passes (a committed chain's)."""
        pinned = self._pinned
        left = list(map(sub, map(pinned.__getitem__, parents), repeat(1)))
        dict.update(pinned, zip(parents, left, strict=True))
        # dict's own __delitem__ (Counter's is Python code): every parent is in `pinned`
        deque(map(dict.__delitem__, repeat(pinned), compress(parents, map(not_, left))), maxlen=0)

    def _unpin(self, parent: int | None) -> None:
        """One reservation fewer waits on `parent` (its entry goes at 0: the Counter does not grow
        with every block ever put)."""
        left = self._pinned[parent] - 1
        if left:
            self._pinned[parent] = left
        else:
            del self._pinned[parent]

    def _kept(self, block_hash: int) -> bool:
        """Not evictable now: under a read lease, or the parent of a block being written."""
        return self._leases.holds(block_hash) or self._pinned[block_hash] > 0

    def _release_pending(self, pending: _Pending) -> None:
        """Give a reservation's space back; written bytes are to be deleted, and the written
        children that waited for this block are released too (their parent never came)."""
        self.forgotten += 1
        block = pending.block
        self._reserved[block.tier] -= block.charge
        self._used[block.tier] -= block.charge
        self._actual_used -= block.size
        if pending.written:
            self._outbox.delete_bytes(block.block_hash)
        for child in sorted(self._waiting.pop(block.block_hash, ())):
            if child in self._pending:
                self._release_pending(self._take_pending(child))
