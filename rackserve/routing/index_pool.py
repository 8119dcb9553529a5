"""PrefixIndex's pool holders: per block, the pool holders' bits and the tiers of the trusted ones
(POOL_IN_* flags), and the prefix closures of the pool's union and of its spare-HBM tier.

A base of PrefixIndex (index.py), which owns the state read here (declared below).
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import and_, not_, or_

from rackserve.routing.closure import PrefixClosure

POOL_IN_HBM = 1  # pool flag bits: block is in some trusted spare-HBM pool holder
POOL_IN_DRAM = 2  # ... in some trusted DRAM pool holder


class IndexPool:
    _closed_chains: bool
    _pool_mask: dict[int, int]
    _pool: dict[int, int]
    _pool_bits: dict[str, int]
    _pool_any: PrefixClosure
    _pool_hbm: PrefixClosure
    _orphans: int
    _stale_bits: int

    def _pool_add(self, blocks: list[int], parents: list[int | None], flag: int) -> None:
        """Set one pool holder's bit on `blocks` (new to it): unions' closures, tier flags."""
        mask, hbm = self._pool_mask, self._pool_bits["pool_hbm"]
        olds = list(map(mask.get, blocks, repeat(0)))
        mask.update(zip(blocks, map(or_, olds, repeat(flag)), strict=True))
        if not self._closed_chains:
            self._pool_closures_add(blocks, parents, olds, flag & hbm)
        if not flag & self._stale_bits:  # a trusted holder's tier joins each block's flags
            tier = POOL_IN_HBM if flag & hbm else POOL_IN_DRAM
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

    def _refresh_pool(self, h: int) -> None:
        bits = self._pool_mask.get(h, 0) & ~self._stale_bits
        tiers = _tier_flags(bits, self._pool_bits["pool_hbm"], self._pool_bits["pool_dram"])
        if tiers:
            self._pool[h] = tiers
        else:
            self._pool.pop(h, None)


def _tier_flags(trusted_bits: int, hbm_bits: int, dram_bits: int) -> int:
    """POOL_IN_* flags of a block held by the pool holders in `trusted_bits`."""
    return (POOL_IN_HBM if trusted_bits & hbm_bits else 0) | (
        POOL_IN_DRAM if trusted_bits & dram_bits else 0
    )
