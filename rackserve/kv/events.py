"""KV events: what a publisher (a rank's HBM cache or a pool tier) stored, removed or cleared.

Each publisher numbers its events 1, 2, 3, ... so a consumer (the router's index) detects a gap
instead of silently trusting a view it missed part of. A publisher that starts over (a restarted
rank actor, a rank that lost its event stream) takes a larger epoch and numbers from 1 again: a
consumer drops what it knew of that publisher and follows the new epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

EventKind = Literal["stored", "removed", "cleared"]
Tier = Literal["rank_hbm", "pool_hbm", "pool_dram"]
TIERS: tuple[Tier, ...] = ("rank_hbm", "pool_hbm", "pool_dram")


@dataclass(frozen=True)
class Publisher:
    """Who publishes: a rank's HBM cache (instance, dp_rank) or the pool (instance="pool", dp_rank=-1 never
    used: pool events name their tier instead and use dp_rank 0)."""

    instance: str
    dp_rank: int = 0

    @property
    def key(self) -> str:
        return f"{self.instance}/{self.dp_rank}"


@dataclass(frozen=True)
class KVEvent:
    """One event. `block_hashes` lists chained block hashes (parent first for stored chains).

    `parent_hash` is the hash of the block before the first one listed (None = chain root), so an
    index can attach a stored chain under its prefix. `cleared` carries no hashes: the publisher's
    whole view of `tier` is gone.
    """

    kind: EventKind
    publisher: Publisher
    seq: int
    tier: Tier
    block_hashes: tuple[int, ...] = ()
    parent_hash: int | None = None
    epoch: int = 0  # the publisher's incarnation: larger = later (services use a start time in ns)

    def __post_init__(self) -> None:
        assert self.seq >= 1, "sequence numbers start at 1"
        assert self.kind != "cleared" or not self.block_hashes, "cleared carries no hashes"


class EventSequencer:
    """Numbers one publisher's events (within one epoch)."""

    def __init__(self, publisher: Publisher, epoch: int = 0) -> None:
        self.publisher = publisher
        self.epoch = epoch
        self._seq = 0

    def make(
        self, kind: EventKind, tier: Tier, block_hashes: tuple[int, ...] = (), parent_hash: int | None = None
    ) -> KVEvent:
        self._seq += 1
        return KVEvent(
            kind, self.publisher, self._seq, tier, tuple(block_hashes), parent_hash, self.epoch
        )

    def restamp(self, event: KVEvent) -> KVEvent:
        """`event` (numbered by someone else, e.g. an engine's cache) in this sequence and epoch."""
        return self.make(event.kind, event.tier, event.block_hashes, event.parent_hash)

    def start_over(self, epoch: int) -> None:
        """A new incarnation: later events carry `epoch` (must grow) and count from 1 again."""
        assert epoch > self.epoch, "epochs only grow"
        self.epoch, self._seq = epoch, 0
