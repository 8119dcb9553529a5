"""Time on the pool's paths: reads and writes of pooled KV take bytes / bandwidth, shared by whoever
uses a path at once.

Each tier has two bottlenecks per direction: the rank's own port (its NVLink for spare HBM, its RDMA
NIC for host DRAM) and the tier's aggregate (all lending GPUs' NVLink, all trays' NICs). Each is a
FIFO fluid link: a transfer starts when the link is free and holds it for bytes / bandwidth; a
transfer's finish is the later of its two links' finishes, plus the path's latency and the tier's
per-transfer setup (config pool.*_transfer_setup_s: submit, completion and the pool's metadata round
trip, which bandwidth does not hide). O(1) per transfer; busy time per tier and direction is kept so
the report can say which path saturates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rackserve.routing.view import RankId
from rackserve.timing.capacity import PoolPath

TIERS = ("pool_hbm", "pool_dram")
DIRECTIONS = ("read", "write")


@dataclass
class Link:
    bw_bytes_per_s: float
    free_at: float = 0.0
    busy_s: float = 0.0
    bytes_moved: float = 0.0

    def take(self, now: float, bytes_: float) -> float:
        """Queue `bytes_` behind earlier transfers; returns when they have crossed the link."""
        start = max(now, self.free_at)
        hold = bytes_ / self.bw_bytes_per_s
        self.free_at = start + hold
        self.busy_s += hold
        self.bytes_moved += bytes_
        return self.free_at


@dataclass
class PoolPaths:
    paths: dict[str, PoolPath]
    setup_s: dict[str, float] = field(default_factory=dict)  # per tier, per transfer
    _aggregate: dict[tuple[str, str], Link] = field(default_factory=dict)
    _ports: dict[tuple[RankId, str, str], Link] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for tier in TIERS:
            for d in DIRECTIONS:
                self._aggregate[(tier, d)] = Link(self.paths[tier].aggregate_bw_bytes_per_s)

    def transfer(self, now: float, rank: RankId, tier: str, direction: str, bytes_: float) -> float:
        """Move `bytes_` between `rank` and `tier`; returns the finish time (now when nothing moves)."""
        if bytes_ <= 0:
            return now
        key = (rank, tier, direction)
        port = self._ports.get(key)
        if port is None:
            port = self._ports[key] = Link(self.paths[tier].port_bw_bytes_per_s)
        done = max(port.take(now, bytes_), self._aggregate[(tier, direction)].take(now, bytes_))
        return done + self.paths[tier].latency_s + self.setup_s.get(tier, 0.0)

    def utilization(self, span_s: float) -> dict[str, float]:
        """Busy fraction of each tier's aggregate link and of its busiest rank port, per direction."""
        out: dict[str, float] = {}
        if span_s <= 0:
            return out
        for (tier, d), link in self._aggregate.items():
            out[f"{tier}_{d}_aggregate"] = link.busy_s / span_s
            ports = [p.busy_s for (_, t, dd), p in self._ports.items() if t == tier and dd == d]
            out[f"{tier}_{d}_busiest_port"] = max(ports, default=0.0) / span_s
        return out

    def bytes_moved(self) -> dict[str, float]:
        return {f"{tier}_{d}": link.bytes_moved for (tier, d), link in self._aggregate.items()}
