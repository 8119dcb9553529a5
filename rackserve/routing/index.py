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
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate, compress, filterfalse, repeat
from operator import and_, not_, or_

from rackserve.kv.events import KVEvent, Publisher, Tier
from rackserve.routing.closure import UNKNOWN_PARENT, PrefixClosure
from rackserve.routing.match import PrefixMatch
from rackserve.routing.view import RankId

_POOL_IN_HBM = 1  # pool flag bits: block is in some trusted spare-HBM pool holder
_POOL_IN_DRAM = 2  # ... in some trusted DRAM pool holder
_CHUNK = 32  # blocks looked up per C-level map() call while searching for the first miss
_KEYS_MEMO = 4096  # rank bit sets remembered by _record_drops before the memo starts over

HolderKey = tuple[Publisher, Tier]


@dataclass(frozen=True)
class IndexSnapshot:
    """Comparable contents of an index: blocks per holder, stale holders, last sequence numbers."""

    blocks: dict[tuple[str, int, str], frozenset[int]]
    stale: frozenset[tuple[str, int, str]]
    seqs: dict[tuple[str, int], int]


class PrefixIndex:
    """The router's view of where KV blocks live, kept current by `apply(event)`.

    Contract on events: a stored event's `parent_hash` names the parent of its first block (None
    only when that block starts a chain); the other blocks follow one another in the chain.

    `closed_chains`: the publishers promise that every holder stays prefix-closed (the offline
    simulator's rank caches and pool: stores after parents, evictions tails first), so lookups
    always take the binary search and no orphan or parent bookkeeping is kept: a store or removal
    is then a few C-level passes per event. Snapshots (`resync`) are refused in that mode.
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
        self._pool: dict[int, int] = {}  # hash -> _POOL_IN_* flags over trusted pool holders
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
        self._tiers_of.setdefault(pub, set()).add(event.tier)
        if event.seq != last + 1:
            self._mark_stale(pub)
        self._seq[pub] = event.seq
        hashes = event.block_hashes
        if event.kind == "stored":
            self._store(self._bit(pub, event.tier), hashes, (event.parent_hash, *hashes[:-1]))
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

    # ---- lookup -------------------------------------------------------------------------------
    def match(
        self,
        block_hashes: Sequence[int],
        block_size: int,
        prompt_tokens: int,
        exact_walk: bool = False,
    ) -> PrefixMatch:
        """Cached prefix of a request (its chained block hashes) on every rank and in the pool.

        exact_walk forces the block-by-block walk (for tests comparing the two paths).
        """
        if self.prefix_closed and not exact_walk:
            ranks = self._rank_prefixes_search(block_hashes)
            pool = self._pool_runs_search(block_hashes, {0, *ranks.values()})
        else:
            ranks = self._rank_prefixes_walk(block_hashes)
            pool = self._pool_runs_walk(block_hashes, {0, *ranks.values()})
        return PrefixMatch(block_size, prompt_tokens, ranks, pool)

    def _rank_prefixes_search(self, hashes: Sequence[int]) -> dict[RankId, int]:
        # Prefix-closed holders: the holder mask along the chain only loses bits, so each
        # change point is found by binary search ("mask still equals its value at pos").
        get = self._rank.get
        n = len(hashes)
        value = get(hashes[0], 0) if n else 0
        trusted = ~self._stale_bits
        out: dict[RankId, int] = {}
        pos = 0
        while value:
            lo, hi = pos + 1, n
            while lo < hi:
                mid = (lo + hi) >> 1
                if get(hashes[mid], 0) == value:
                    lo = mid + 1
                else:
                    hi = mid
            nxt = get(hashes[lo], 0) if lo < n else 0
            self._record_drops(out, value & ~nxt & trusted, lo)
            value, pos = nxt, lo
        return out

    def _pool_runs_search(
        self, hashes: Sequence[int], starts: set[int]
    ) -> dict[int, tuple[int, int]]:
        # Prefix-closed unions: the pool holds blocks [0, end_any) of the chain, and its spare
        # HBM tier holds [0, end_hbm) with end_hbm <= end_any.
        end_any = _first_without(self._pool.get, hashes, _POOL_IN_HBM | _POOL_IN_DRAM, len(hashes))
        end_hbm = _first_without(self._pool.get, hashes, _POOL_IN_HBM, end_any)
        out: dict[int, tuple[int, int]] = {}
        for s in starts:
            in_hbm = max(0, end_hbm - s)
            out[s] = (in_hbm, max(0, end_any - s) - in_hbm)
        return out

    def _rank_prefixes_walk(self, hashes: Sequence[int]) -> dict[RankId, int]:
        masks = _until_miss(self._rank.get, hashes, 0)
        if not masks:
            return {}
        # cum[i] has bit b iff holder b holds blocks 0..i: non-increasing, few distinct values.
        cum = list(accumulate(masks, and_))
        values = list(dict.fromkeys(cum))
        trusted = ~self._stale_bits
        out: dict[RankId, int] = {}
        for j, value in enumerate(values):
            last = j + 1 == len(values)
            nxt = 0 if last else values[j + 1]
            end = len(cum) if last else cum.index(nxt)
            self._record_drops(out, value & ~nxt & trusted, end)
        return out

    def _pool_runs_walk(
        self, hashes: Sequence[int], starts: set[int]
    ) -> dict[int, tuple[int, int]]:
        get = self._pool.get
        first = _until_miss(get, hashes, 0)
        out: dict[int, tuple[int, int]] = {}
        for s in starts:
            run = first[s:] if s < len(first) else _until_miss(get, hashes, s)
            dram_only = run.count(_POOL_IN_DRAM)
            out[s] = (len(run) - dram_only, dram_only)
        return out

    def _record_drops(self, out: dict[RankId, int], dropped: int, end: int) -> None:
        """out[rank] = end for every rank bit in `dropped` (bit sets repeat: memoised)."""
        if not dropped:
            return
        keys = self._keys_of.get(dropped)
        if keys is None:
            if len(self._keys_of) >= _KEYS_MEMO:
                self._keys_of.clear()
            keys = self._keys_of[dropped] = self._bits_to_keys(dropped)
        out.update(zip(keys, repeat(end)))

    def _bits_to_keys(self, bits: int) -> tuple[RankId, ...]:
        keys = []
        while bits:
            low = bits & -bits
            keys.append(self._rank_key[low.bit_length() - 1])
            bits ^= low
        return tuple(keys)

    # ---- internals ----------------------------------------------------------------------------
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

    def _pool_add(self, blocks: list[int], parents: list[int | None], flag: int) -> None:
        """Set one pool holder's bit on `blocks` (new to it): unions' closures, tier flags."""
        mask, hbm = self._pool_mask, self._pool_bits["pool_hbm"]
        olds = list(map(mask.get, blocks, repeat(0)))
        mask.update(zip(blocks, map(or_, olds, repeat(flag)), strict=True))
        if not self._closed_chains:
            self._pool_closures_add(blocks, parents, olds, flag & hbm)
        if not flag & self._stale_bits:  # a trusted holder's tier joins each block's flags
            tier = _POOL_IN_HBM if flag & hbm else _POOL_IN_DRAM
            flags = self._pool
            joined = map(or_, map(flags.get, blocks, repeat(0)), repeat(tier))
            flags.update(zip(blocks, joined, strict=True))

    def _pool_closures_add(self, blocks: list[int], parents: list[int | None], olds: list[int], to_hbm: int) -> None:
        """The pool unions' closures after a holder's bit was set on `blocks` (`olds`: masks before)."""
        entering = list(map(not_, olds))  # blocks new to the pool as a whole
        if any(entering):
            self._orphans += self._pool_any.added_many(
                list(compress(blocks, entering)),
                list(compress(parents, entering)),
                self._pool_mask.__contains__,
            )
        if to_hbm:
            entering = list(map(not_, map(and_, olds, repeat(self._pool_bits["pool_hbm"]))))
            if any(entering):
                self._orphans += self._pool_hbm.added_many(
                    list(compress(blocks, entering)),
                    list(compress(parents, entering)),
                    self._in_pool_hbm,
                )

    def _pool_remove(self, blocks: list[int], parents: list[int | None], flag: int) -> None:
        """Clear one pool holder's bit on `blocks`: unions' closures, tier flags."""
        mask, hbm = self._pool_mask, self._pool_bits["pool_hbm"]
        if self._closed_chains:  # no closures: the bits and flags only
            for h in blocks:
                new = mask[h] & ~flag
                if new:
                    mask[h] = new
                else:
                    del mask[h]
                self._refresh_pool(h)
            return
        left_pool: tuple[list[int], list[int | None]] = ([], [])
        left_hbm: tuple[list[int], list[int | None]] = ([], [])
        for h, p in zip(blocks, parents, strict=True):
            old = mask[h]
            new = old & ~flag
            if new:
                mask[h] = new
            else:
                del mask[h]
                left_pool[0].append(h)
                left_pool[1].append(p)
            if old & hbm and not new & hbm:
                left_hbm[0].append(h)
                left_hbm[1].append(p)
            self._refresh_pool(h)
        self._orphans += self._pool_any.removed_many(*left_pool, mask.__contains__)
        self._orphans += self._pool_hbm.removed_many(*left_hbm, self._in_pool_hbm)

    def _in_pool_hbm(self, h: int) -> bool:
        return bool(self._pool_mask.get(h, 0) & self._pool_bits["pool_hbm"])

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

    def _refresh_pool(self, h: int) -> None:
        bits = self._pool_mask.get(h, 0) & ~self._stale_bits
        tiers = _tier_flags(bits, self._pool_bits["pool_hbm"], self._pool_bits["pool_dram"])
        if tiers:
            self._pool[h] = tiers
        else:
            self._pool.pop(h, None)


def _tier_flags(trusted_bits: int, hbm_bits: int, dram_bits: int) -> int:
    """_POOL_IN_* flags of a block held by the pool holders in `trusted_bits`."""
    return (_POOL_IN_HBM if trusted_bits & hbm_bits else 0) | (
        _POOL_IN_DRAM if trusted_bits & dram_bits else 0
    )


def _first_without(
    get: Callable[[int, int], int], hashes: Sequence[int], bits: int, hi: int
) -> int:
    """First i < hi with get(hashes[i], 0) & bits == 0 (else hi), for a predicate true on a
    prefix only."""
    lo = 0
    while lo < hi:
        mid = (lo + hi) >> 1
        if get(hashes[mid], 0) & bits:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _until_miss(get: Callable[[int, int], int], hashes: Sequence[int], start: int) -> list[int]:
    """get(h, 0) for hashes[start:] up to (excluding) the first 0; lookups run in C, chunk by chunk."""
    out: list[int] = []
    n = len(hashes)
    i = start
    while i < n:
        chunk = list(map(get, hashes[i : i + _CHUNK], repeat(0)))
        if 0 in chunk:
            out += chunk[: chunk.index(0)]
            return out
        out += chunk
        i += _CHUNK
    return out
