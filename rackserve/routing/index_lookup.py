"""PrefixIndex's lookup: a request's cached prefix on every rank and in the pool (PrefixMatch).

Prefix-closed holders (no holes, no stale pool holder) take binary searches along the chain: each
rank's first miss is a change point of the holder mask, which only loses bits. Otherwise an exact
walk whose lookups run in C (map + itertools.accumulate). A base of PrefixIndex (index.py), which
owns the state read here (declared below).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import accumulate, repeat
from operator import and_

from rackserve.routing.index_pool import POOL_IN_DRAM, POOL_IN_HBM
from rackserve.routing.match import PrefixMatch
from rackserve.routing.view import RankId

RankLookup = Callable[[Sequence[int]], dict[RankId, int]]  # hashes -> leading blocks per rank
PoolLookup = Callable[[Sequence[int]], tuple[int, int]]  # hashes -> (leading pool blocks, of them pool_hbm)
InstancePoolLookup = Callable[[Sequence[int]], dict[str, tuple[int, int]]]  # the same, per instance's pool
_CHUNK = 32  # blocks looked up per C-level map() call while searching for the first miss
_KEYS_MEMO = 4096  # rank bit sets remembered by _record_drops before the memo starts over


class IndexLookup:
    _rank: dict[int, int]
    _pool: dict[int, int]
    _stale_bits: int
    _rank_key: dict[int, RankId]
    _keys_of: dict[int, tuple[RankId, ...]]
    _rank_lookup: RankLookup | None  # rank prefixes answered by their holders (delegate_ranks)
    _pool_lookup: PoolLookup | None  # the pool's prefix answered by the pool (delegate_pool)
    _instance_pools: InstancePoolLookup | None  # a pool per instance (delegate_instance_pools)
    prefix_closed: bool  # a property of PrefixIndex: True when the binary searches are exact

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
        closed = self.prefix_closed and not exact_walk
        if self._rank_lookup is not None:
            ranks = self._rank_lookup(block_hashes)
        elif closed:
            ranks = self._rank_prefixes_search(block_hashes)
        else:
            ranks = self._rank_prefixes_walk(block_hashes)
        starts = {0, *ranks.values()}
        if self._instance_pools is not None:
            return PrefixMatch(block_size, prompt_tokens, ranks, {}, self._instance_pools(block_hashes))
        if self._pool_lookup is not None:
            pool = _runs_from_ends(*self._pool_lookup(block_hashes), starts)
        elif closed:
            pool = self._pool_runs_search(block_hashes, starts)
        else:
            pool = self._pool_runs_walk(block_hashes, starts)
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
        end_any = _first_without(self._pool.get, hashes, POOL_IN_HBM | POOL_IN_DRAM, len(hashes))
        end_hbm = _first_without(self._pool.get, hashes, POOL_IN_HBM, end_any)
        return _runs_from_ends(end_any, end_hbm, starts)

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
            dram_only = run.count(POOL_IN_DRAM)
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


def _runs_from_ends(end_any: int, end_hbm: int, starts: set[int]) -> dict[int, tuple[int, int]]:
    """Pool runs from each start of a chain whose blocks [0, end_any) are pooled, [0, end_hbm) in
    pool_hbm: start -> (pool_hbm blocks, pool_dram blocks)."""
    out: dict[int, tuple[int, int]] = {}
    for s in starts:
        in_hbm = max(0, end_hbm - s)
        out[s] = (in_hbm, max(0, end_any - s) - in_hbm)
    return out


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
