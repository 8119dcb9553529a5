"""PoolClient: what prefill/decode workers use to put and get KV blocks in the rack pool.

Metadata goes through the pool service (gRPC); block bytes go straight to Redis with pipelined
SET / MGET (Mooncake's master / transfer split). Faults degrade, never raise: a put that cannot
get space or cannot write reports the blocks as failed (the caller recomputes them); a get
against a Redis that lost its data or a pool that is down returns misses.
Malformed requests (caller bugs) raise ValueError with the server's message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
import redis

from rackserve.kv.pool_tiers import PoolPrefix, PoolTier
from services._proto import kvpool_pb2 as pb
from services._proto import kvpool_pb2_grpc as pb_grpc
from services.kvpool.block_writer import set_blocks
from services.kvpool.keys import block_keys

log = logging.getLogger(__name__)

PB_TO_TIER: dict[int, PoolTier | None] = {pb.TIER_NONE: None, pb.POOL_HBM: "pool_hbm", pb.POOL_DRAM: "pool_dram"}
TIER_TO_PB: dict[PoolTier | None, int] = {t: v for v, t in PB_TO_TIER.items()}
_DEGRADED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


@dataclass(frozen=True)
class PutResult:
    """`stored`: committed in the pool now (written by us, or already there). `pending`: being
    written by another writer, not readable yet (not counted as stored). `failed`: not stored
    (no space, Redis or pool failure): recompute these next time."""

    stored: tuple[int, ...]
    written: tuple[int, ...]
    failed: tuple[int, ...]
    pending: tuple[int, ...] = ()
    lease_id: int = 0  # put(hold=True): a read lease over `stored`, for the reader to release
    lease_tiers: tuple[PoolTier | None, ...] = ()  # put(hold=True): each put hash's tier as leased

    @property
    def ok(self) -> bool:
        return not self.failed


@dataclass(frozen=True)
class Reservation:
    """`PoolClient.reserve`'s booking: each hash's PutStatus (empty: the pool was unreachable),
    the transaction to commit (0: nothing reserved) and when it lapses (time.monotonic())."""

    hashes: tuple[int, ...]
    sizes: tuple[int, ...]
    statuses: tuple[int, ...]
    txn: int
    deadline_s: float


@dataclass(frozen=True)
class LeasedLookup:
    """Where each block is (None = miss); the hits are leased (eviction cannot take them) until
    `PoolClient.read` has read them and released the lease."""

    hashes: tuple[int, ...]
    tiers: tuple[PoolTier | None, ...]
    lease_id: int  # 0 = no hit, or the pool was unreachable


@dataclass(frozen=True)
class GetResult:
    """Bytes per requested block (None = miss) and the tier each hit came from."""

    values: tuple[bytes | None, ...]
    tiers: tuple[PoolTier | None, ...]

    @property
    def hits(self) -> int:
        return sum(v is not None for v in self.values)

    def leading(self) -> list[bytes]:
        """The contiguous hits from the first block: what a prefix reuse can load."""
        out = []
        for value in self.values:
            if value is None:
                break
            out.append(value)
        return out


class PoolClient:
    """Client of one pool service. Thread-safe (gRPC channels and redis-py pools are)."""

    def __init__(self, address: str, owner: str = "client", redis_url: str | None = None,
                 timeout_s: float = 10.0) -> None:
        self.owner = owner
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 16 * 1024**2)])
        self._stub = pb_grpc.KVPoolStub(self._channel)
        health = self._stub.Health(pb.HealthRequest(), timeout=timeout_s, wait_for_ready=True)
        self.key_prefix = health.key_prefix
        self.event_stream = health.event_stream
        self.max_blocks_per_request = health.max_blocks_per_request
        self.redis = redis.Redis.from_url(redis_url or health.redis_url, socket_timeout=timeout_s)
        self._releaser = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvpool-release")

    # ---- puts -----------------------------------------------------------------------------
    def put(self, hashes: Sequence[int], values: Sequence[bytes], parent_hash: int | None = None,
            target_sizes: Sequence[int] | None = None, hold: bool = False) -> PutResult:
        """Store blocks of one chain (`parent_hash` precedes hashes[0]); two-phase, never raises
        for Redis/pool faults. `target_sizes`: bytes each block weighs in the emulated rack.
        `hold`: also lease the stored blocks (in the commit call) for a reader elsewhere, who
        releases `PutResult.lease_id` once it has read them (the P->D hand-off)."""
        if len(hashes) != len(values):
            raise ValueError(f"hashes and values differ in length: {len(hashes)} != {len(values)}")
        return self.complete(self.reserve(hashes, [len(v) for v in values], parent_hash, target_sizes),
                             values, hold)

    def reserve(self, hashes: Sequence[int], sizes: Sequence[int], parent_hash: int | None = None,
                target_sizes: Sequence[int] | None = None) -> Reservation:
        """The first half of `put`: book space for blocks of `sizes` bytes (a writer may reserve
        while it still computes them); `complete` writes and commits, `abort` gives it back."""
        hashes = tuple(int(h) for h in hashes)  # numpy integers are not protobuf integers
        request = pb.ReserveRequest(owner=self.owner, block_hashes=hashes, sizes=sizes,
                                    target_sizes=target_sizes or (), has_parent=parent_hash is not None,
                                    parent_hash=parent_hash or 0)
        started = time.monotonic()
        reply = self._call(self._stub.BatchPutReserve, request)
        if reply is None:
            return Reservation(hashes, tuple(sizes), (), 0, started)
        return Reservation(hashes, tuple(sizes), tuple(reply.statuses), reply.txn,
                           started + reply.expires_in_s)

    def complete(self, res: Reservation, values: Sequence[bytes], hold: bool = False) -> PutResult:
        """Write a reservation's reserved blocks (`values`: one per hash) and commit them; with
        `hold`, lease the stored ones for a reader (see `put`)."""
        hashes = list(res.hashes)
        if len(hashes) != len(values):
            raise ValueError(f"hashes and values differ in length: {len(hashes)} != {len(values)}")
        if not res.statuses:
            return PutResult((), (), tuple(hashes))
        todo = [i for i, s in enumerate(res.statuses) if s == pb.PUT_RESERVED]
        there = [hashes[i] for i, s in enumerate(res.statuses) if s == pb.PUT_EXISTS]
        pending = tuple(hashes[i] for i, s in enumerate(res.statuses) if s == pb.PUT_PENDING)
        refused = [hashes[i] for i, s in enumerate(res.statuses) if s == pb.PUT_NO_SPACE]
        if not todo:
            return PutResult(tuple(there), (), tuple(refused), pending, *self._hold(hashes, hold))
        written = self._write([hashes[i] for i in todo], [values[i] for i in todo])
        if not written:
            self.abort(res)
            return PutResult(tuple(there), (), tuple(refused + [hashes[i] for i in todo]), pending,
                             *self._hold(hashes, hold))
        commit = self._call(self._stub.BatchPutCommit,
                            pb.CommitRequest(txn=res.txn, written=written, hold=hashes if hold else ()))
        committed = set(commit.committed) if commit is not None else set()
        lost = [h for h in written if h not in committed]
        lease = (commit.lease_id, _tiers(commit.held_tiers)) if commit is not None else (0, ())
        return PutResult(tuple(there + [h for h in written if h in committed]),
                         tuple(h for h in written if h in committed), tuple(refused + lost), pending,
                         *lease)

    def abort(self, res: Reservation) -> None:
        """Give back what a reservation booked and was not committed (nothing to do if none)."""
        if res.txn:
            self._call(self._stub.BatchPutAbort, pb.AbortRequest(txn=res.txn))

    def _hold(self, hashes: list[int], hold: bool) -> tuple[int, tuple[PoolTier | None, ...]]:
        """With `hold`, lease those of `hashes` stored now: (lease id, each one's tier)."""
        if not (hold and hashes):
            return 0, ()
        reply = self._call(self._stub.Lease, pb.LeaseRequest(block_hashes=hashes))
        if reply is None or not reply.lease_id:
            return 0, ()
        return reply.lease_id, _tiers(reply.tiers)

    def _write(self, hashes: list[int], values: list[bytes]) -> list[int]:
        try:
            set_blocks(self.redis, block_keys(self.key_prefix, hashes), values)
        except redis.RedisError as exc:
            log.warning("pool put: Redis write of %d blocks failed: %s", len(hashes), exc)
            return []
        return hashes

    # ---- gets -----------------------------------------------------------------------------
    def get(self, hashes: Sequence[int]) -> GetResult:
        """Bytes of each block or None. Hits are leased until read, so eviction cannot race."""
        return self.read(self.lookup(hashes))

    def lookup(self, hashes: Sequence[int]) -> LeasedLookup:
        """Where each block is, its hits leased until `read` (the first half of `get`)."""
        hashes = tuple(int(h) for h in hashes)
        reply = self._call(self._stub.BatchGet, pb.GetRequest(block_hashes=hashes, lease=True)) if hashes else None
        if reply is None:
            return LeasedLookup(hashes, (None,) * len(hashes), 0)
        return LeasedLookup(hashes, tuple(PB_TO_TIER[t] for t in reply.tiers), reply.lease_id)

    def read(self, found: LeasedLookup) -> GetResult:
        """The bytes of a lookup's hits (None = miss), then its lease released."""
        hit_idx = [i for i, t in enumerate(found.tiers) if t is not None]
        values: list[bytes | None] = [None] * len(found.hashes)
        if hit_idx:
            for i, value in zip(hit_idx, self._read([found.hashes[i] for i in hit_idx]), strict=True):
                values[i] = value
        self.release(found.lease_id)
        tiers = [t if v is not None else None for t, v in zip(found.tiers, values, strict=True)]
        return GetResult(tuple(values), tuple(tiers))

    def read_leased(self, hashes: Sequence[int], tiers: Sequence[PoolTier | None], lease_id: int) -> GetResult:
        """The bytes of blocks a writer leased for us (`put(hold=True)`'s lease and tiers), read
        straight from Redis without asking the pool where they are; then the lease is released.
        A block whose bytes are gone (the lease expired and eviction took it, Redis restarted
        empty) is a miss."""
        if len(tiers) != len(hashes):
            raise ValueError(f"hashes and tiers differ in length: {len(hashes)} != {len(tiers)}")
        return self.read(LeasedLookup(tuple(int(h) for h in hashes), tuple(tiers), lease_id))

    def _read(self, hashes: list[int]) -> list[bytes | None]:
        try:
            return self.redis.mget(block_keys(self.key_prefix, hashes))
        except redis.RedisError as exc:
            log.warning("pool get: Redis read of %d blocks failed: %s", len(hashes), exc)
            return [None] * len(hashes)

    def hold(self, hashes: Sequence[int]) -> int:
        """Lease those of the blocks that are stored, without reading them; the lease id (0: none
        stored, or the pool unreachable) goes to whoever reads them, who releases it."""
        reply = self._call(self._stub.Lease, pb.LeaseRequest(block_hashes=[int(h) for h in hashes]))
        return 0 if reply is None else reply.lease_id

    def release(self, lease_id: int) -> None:
        """Give a lease back (0: nothing to do). Fire-and-forget on one background thread: an
        unreleased lease simply expires."""
        if lease_id:
            self._releaser.submit(self._call, self._stub.ReleaseLease, pb.ReleaseRequest(lease_id=lease_id))

    def flush_releases(self) -> None:
        """Wait until every lease given back so far has reached the pool (or failed to)."""
        self._releaser.submit(lambda: None).result()

    # ---- metadata -------------------------------------------------------------------------
    def match_prefix(self, hashes: Sequence[int]) -> PoolPrefix:
        """Leading blocks of a chain present in the pool, and their tiers (no lease, no LRU touch)."""
        reply = self._call(self._stub.MatchPrefix, pb.MatchPrefixRequest(block_hashes=[int(h) for h in hashes]))
        if reply is None:
            return PoolPrefix(0, ())
        return PoolPrefix(reply.count, tuple(PB_TO_TIER[t] for t in reply.tiers))  # type: ignore[misc]

    def remove(self, hashes: Sequence[int]) -> tuple[int, ...]:
        reply = self._call(self._stub.Remove, pb.RemoveRequest(block_hashes=[int(h) for h in hashes]))
        return () if reply is None else tuple(reply.removed)

    def stats(self) -> pb.StatsReply:
        return self._stub.Stats(pb.StatsRequest(), timeout=self.timeout_s)

    def health(self) -> pb.HealthReply:
        return self._stub.Health(pb.HealthRequest(), timeout=self.timeout_s)

    def close(self) -> None:
        self._releaser.shutdown(wait=True)
        self._channel.close()
        self.redis.close()

    def __enter__(self) -> PoolClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: grpc.UnaryUnaryMultiCallable, request: object) -> object | None:
        """Unary call; None when the pool is unreachable, ValueError on INVALID_ARGUMENT."""
        try:
            return method(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            code = exc.code()  # type: ignore[attr-defined]
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                raise ValueError(exc.details()) from None  # type: ignore[attr-defined]
            if code in _DEGRADED:
                log.warning("pool unreachable (%s): degrading to a miss", code)
                return None
            raise


def _tiers(values: Sequence[int]) -> tuple[PoolTier | None, ...]:
    return tuple(PB_TO_TIER[t] for t in values)
