"""Read leases over pool blocks: a leased block is never evicted until the lease is released or
expires (`lease_s` after it was granted)."""

from __future__ import annotations

import heapq
from collections import Counter


class Leases:
    def __init__(self, lease_s: float) -> None:
        self.lease_s = lease_s
        self._hashes: dict[int, tuple[int, ...]] = {}  # lease id -> the blocks it holds
        self._held: Counter[int] = Counter()  # block hash -> leases holding it
        self._heap: list[tuple[float, int]] = []  # (expiry, lease id)

    def __len__(self) -> int:
        return len(self._hashes)

    def holds(self, block_hash: int) -> bool:
        return self._held[block_hash] > 0

    def grant(self, lease_id: int, hashes: tuple[int, ...], now: float) -> float:
        """Lease `hashes` under `lease_id`; returns when it expires."""
        self._hashes[lease_id] = hashes
        self._held.update(hashes)
        expires_at = now + self.lease_s
        heapq.heappush(self._heap, (expires_at, lease_id))
        return expires_at

    def release(self, lease_id: int) -> bool:
        """False if the lease already expired or never existed."""
        hashes = self._hashes.pop(lease_id, None)
        if hashes is None:
            return False
        self._held.subtract(hashes)
        return True

    def expire(self, now: float) -> int:
        """Release the leases whose time is up; returns how many."""
        expired = 0
        while self._heap and self._heap[0][0] <= now:
            _, lease_id = heapq.heappop(self._heap)
            expired += self.release(lease_id)
        return expired

    def clear(self) -> None:
        self._hashes.clear()
        self._held.clear()
        self._heap.clear()
