"""An LRU-ordered set of integer keys: what a simulated rank's HBM prefix cache holds (sim/kv.py RankCache).

`LruSet` is the C implementation (sim/_lruset.c, built by `pip install -e .`: setup.py) when it is
importable, else `PyLruSet`, the same behaviour on an OrderedDict, which is also the reference its
tests hold it to (tests/unit/sim/test_lru_set.py). Keys are Python ints in [-2**63, 2**64) (block
hashes are unsigned 64-bit); the C set keeps each in 24 bytes of one array, where the OrderedDict
spends ~120 bytes on a dict entry, a linked node and an int object, so a rank's ~100 k keys stay
nearer the CPU caches, and a chain's store, touch and eviction is one call.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice, repeat


class PyLruSet:
    """The reference: keys of an OrderedDict, least recent first."""

    def __init__(self) -> None:
        self._od: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._od)

    def __contains__(self, key: object) -> bool:
        return key in self._od

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._od))

    def keys(self) -> list[int]:
        return list(self._od)

    def match(self, hashes: Sequence[int]) -> int:
        """Leading keys present, by bisection (the set holds prefixes of chains: see RankCache)."""
        od = self._od
        lo, hi = 0, len(hashes)
        if hi == 0 or hashes[0] not in od:
            return 0
        if hashes[-1] in od:
            return hi
        lo = 1
        while lo < hi:  # invariant: hashes[lo-1] present, hashes[hi] absent (or hi == len)
            mid = (lo + hi) // 2
            if hashes[mid] in od:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def store(self, hashes: Sequence[int], held: int, capacity: int) -> tuple[int, ...]:
        """The keys past `held` added last first (one already present keeps its place), the held
        prefix touched last first (the chain's head ends most recent), then the least recent
        evicted down to `capacity`: returns those, least recent first."""
        if not 0 <= held <= len(hashes):
            raise ValueError(f"held: must be in [0, {len(hashes)}], got {held}")
        od = self._od
        for h in hashes[held:]:
            if not isinstance(h, int):
                raise TypeError(f"LruSet keys must be ints, got {type(h).__name__}")
        if held < len(hashes):
            od.update(zip(reversed(hashes[held:]), repeat(None)))  # pairs, not a dict built first
        deque(map(od.move_to_end, reversed(hashes[:held])), maxlen=0)  # in C
        excess = len(od) - capacity
        if excess <= 0:
            return ()
        gone = tuple(islice(od, excess))
        deque(map(od.__delitem__, gone), maxlen=0)
        return gone

    def among(self, keys: Iterable[int]) -> set[int]:
        """The held ones of `keys`."""
        return self._od.keys() & keys


def py_prefixes(sets: tuple, names: tuple, hashes: Sequence[int]) -> dict:
    """{names[i]: sets[i].match(hashes)} for the sets whose match is not 0 (one call for every rank)."""
    if len(sets) != len(names):
        raise ValueError(f"prefixes: {len(sets)} sets, {len(names)} names")
    if not hashes:
        return {}
    head = hashes[0]
    return {name: s.match(hashes) for s, name in zip(sets, names, strict=True) if head in s}


try:
    from rackserve.sim._lruset import LruSet, prefixes
except ImportError:  # not built (an install without a C compiler): the same behaviour in Python
    LruSet = PyLruSet  # type: ignore[misc,assignment]
    prefixes = py_prefixes
