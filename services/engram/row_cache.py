"""A rank's cache of Engram rows it fetched before: direct-mapped, one per table, vectorized.

Engram rows never change (they are generated from the seed), so a cached row is always right;
n-grams are Zipf-distributed, so a small cache of the rows a rank has seen answers most lookups
without the round trip to the shards (DeepSeek's Engram keeps hot rows in faster memory the same
way). Slot = row id mod capacity; a newer row takes its slot's place.
"""

from __future__ import annotations

import numpy as np


class RowCache:
    """Up to `capacity` rows of `dim` float32 values, keyed by row id."""

    def __init__(self, capacity: int, dim: int) -> None:
        assert capacity > 0, "a RowCache needs at least one slot"
        self.capacity = capacity
        self._tags = np.full(capacity, -1, dtype=np.int64)
        self._rows = np.zeros((capacity, dim), dtype=np.float32)

    def hits(self, ids: np.ndarray) -> np.ndarray:
        """Boolean mask of the (int64) `ids` whose rows are cached."""
        return self._tags[ids % self.capacity] == ids

    def get(self, ids: np.ndarray) -> np.ndarray:
        """Rows of cached `ids` (call with ids that `hits` found only)."""
        return self._rows[ids % self.capacity]

    def put(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Keep `rows[i]` as the row of `ids[i]`; of ids sharing a slot the last one stays."""
        slots = ids % self.capacity
        _, last = np.unique(slots[::-1], return_index=True)
        keep = len(ids) - 1 - last
        self._tags[slots[keep]] = ids[keep]
        self._rows[slots[keep]] = rows[keep]
