"""What the pool has to tell the world since the last drain: KV events (numbered at drain, one
event per run of the same change along a chain) and the hashes whose bytes must be deleted."""

from __future__ import annotations

from rackserve.kv.events import EventSequencer, KVEvent, Publisher
from rackserve.kv.pool_limits import PoolTier


class PoolOutbox:
    __slots__ = ("_dropped", "_events", "_sequencer")

    def __init__(self, publisher: Publisher, epoch: int = 0) -> None:
        self._sequencer = EventSequencer(publisher, epoch)  # epoch: the pool process's start
        self._events: list[tuple[str, PoolTier, list[int], int | None]] = []
        self._dropped: list[int] = []

    def emit(self, kind: str, tier: PoolTier, block_hash: int, parent: int | None = None) -> None:
        """Queue an event, extending the previous one when it continues the same chain."""
        last = self._events[-1] if self._events else None
        if last and last[0] == kind and last[1] == tier and kind != "stored":
            last[2].append(block_hash)
            return
        if last and last[0] == kind == "stored" and last[1] == tier and last[2] and parent == last[2][-1]:
            last[2].append(block_hash)
            return
        self._events.append((kind, tier, [block_hash], parent))

    def emit_run(self, tier: PoolTier, hashes: list[int], parent: int | None) -> None:
        """`emit("stored", tier, h, parent_of_h)` for each block of a chain run (each hash's parent is
        the one before it, the first's is `parent`), in one step."""
        last = self._events[-1] if self._events else None
        if last and last[0] == "stored" and last[1] == tier and last[2] and parent == last[2][-1]:
            last[2].extend(hashes)
            return
        self._events.append(("stored", tier, list(hashes), parent))

    def cleared(self, tier: PoolTier) -> None:
        self._events.append(("cleared", tier, [], None))

    def delete_bytes(self, block_hash: int) -> None:
        self._dropped.append(block_hash)

    def drain(self) -> tuple[list[KVEvent], list[int]]:
        """Events since the last drain (numbered now) and hashes whose bytes must be deleted."""
        events = [self._sequencer.make(kind, tier, tuple(hashes), parent)  # type: ignore[arg-type]
                  for kind, tier, hashes, parent in self._events]
        dropped = self._dropped
        self._events, self._dropped = [], []
        return events, dropped
