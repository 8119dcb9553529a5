"""What the pool has to tell the world since the last drain: KV events (numbered at drain, one
event per run of the same change along a chain) and the hashes whose bytes must be deleted.

Demotions (pool_hbm -> pool_dram) come one block at a time, tails first, so as per-block events
they would alternate removed/stored and never merge; a run of demotions with nothing else between
is published as one `removed` pool_hbm event and `stored` pool_dram events in chain order (one per
unbroken chain piece). Each block's change is the same, only the event count falls.
"""

from __future__ import annotations

from rackserve.kv.events import EventSequencer, KVEvent, Publisher
from rackserve.kv.pool_limits import PoolTier


class PoolOutbox:
    __slots__ = ("_demoted", "_dropped", "_events", "_sequencer")

    def __init__(self, publisher: Publisher, epoch: int = 0) -> None:
        self._sequencer = EventSequencer(publisher, epoch)  # epoch: the pool process's start
        self._events: list[tuple[str, PoolTier, list[int], int | None]] = []
        self._dropped: list[int] = []
        self._demoted: list[tuple[int, int | None]] = []  # (hash, parent) of the current demotion run

    def demote(self, block_hash: int, parent: int | None) -> None:
        """`emit("removed", "pool_hbm", h); emit("stored", "pool_dram", h, parent)`, queued with the
        demotions right before it (flushed as a run before any other event)."""
        self._demoted.append((block_hash, parent))

    def _flush_demoted(self) -> None:
        run = self._demoted
        self._demoted = []
        self._emit_removed("pool_hbm", [h for h, _ in run])
        piece: list[int] = []
        first_parent: int | None = None
        for h, parent in reversed(run):  # victims come tails first: reversed, parents come first
            if piece and parent != piece[-1]:
                self.emit_run("pool_dram", piece, first_parent)
                piece = []
            if not piece:
                first_parent = parent
            piece.append(h)
        self.emit_run("pool_dram", piece, first_parent)

    def _emit_removed(self, tier: PoolTier, hashes: list[int]) -> None:
        last = self._events[-1] if self._events else None
        if last and last[0] == "removed" and last[1] == tier:
            last[2].extend(hashes)
            return
        self._events.append(("removed", tier, hashes, None))

    def emit(self, kind: str, tier: PoolTier, block_hash: int, parent: int | None = None) -> None:
        """Queue an event, extending the previous one when it continues the same chain."""
        if self._demoted:
            self._flush_demoted()
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
        if self._demoted:
            self._flush_demoted()
        last = self._events[-1] if self._events else None
        if last and last[0] == "stored" and last[1] == tier and last[2] and parent == last[2][-1]:
            last[2].extend(hashes)
            return
        self._events.append(("stored", tier, list(hashes), parent))

    def cleared(self, tier: PoolTier) -> None:
        if self._demoted:
            self._flush_demoted()
        self._events.append(("cleared", tier, [], None))

    def delete_bytes(self, block_hash: int) -> None:
        self._dropped.append(block_hash)

    def drain(self) -> tuple[list[KVEvent], list[int]]:
        """Events since the last drain (numbered now) and hashes whose bytes must be deleted."""
        if self._demoted:
            self._flush_demoted()
        events = [self._sequencer.make(kind, tier, tuple(hashes), parent)  # type: ignore[arg-type]
                  for kind, tier, hashes, parent in self._events]
        dropped = self._dropped
        self._events, self._dropped = [], []
        return events, dropped
