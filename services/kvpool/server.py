"""The KV pool's gRPC service: `PoolTiers` metadata behind one lock, effects applied to Redis.

Handlers validate (INVALID_ARGUMENT naming the field), call the pure core, and hand the KV events
and dropped keys to the store's ordered publisher thread (off the request path). A watcher thread notices Redis restarting empty (the epoch key).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass

import grpc
import redis

from rackserve.kv.pool_tiers import PoolLimits, PoolTier, PoolTiers
from services import kvevents
from services._proto import kvpool_pb2 as pb
from services._proto import kvpool_pb2_grpc as pb_grpc
from services.kvpool import validate
from services.kvpool.client import TIER_TO_PB
from services.kvpool.keys import DEFAULT_PREFIX
from services.kvpool.store import PoolStore

log = logging.getLogger(__name__)

STATUS_TO_PB = {"reserved": pb.PUT_RESERVED, "exists": pb.PUT_EXISTS, "pending": pb.PUT_PENDING,
                "no_space": pb.PUT_NO_SPACE}
MAX_MESSAGE_BYTES = 16 * 1024**2  # transport limit; the per-request block limit is checked first


@dataclass(frozen=True)
class PoolOptions:
    redis_url: str
    key_prefix: str = DEFAULT_PREFIX
    event_stream: str = kvevents.STREAM
    max_blocks_per_request: int = 16384
    max_block_bytes: int = 64 * 1024**2
    epoch_check_s: float = 0.2


def _edge(method: Callable) -> Callable:
    """Turn InvalidRequest into INVALID_ARGUMENT with its message."""

    @functools.wraps(method)
    def wrapper(self: PoolServicer, request: object, context: grpc.ServicerContext) -> object:
        try:
            return method(self, request, context)
        except validate.InvalidRequest as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    return wrapper


class PoolServicer(pb_grpc.KVPoolServicer):
    def __init__(self, tiers: PoolTiers, store: PoolStore, options: PoolOptions,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.tiers = tiers
        self.store = store
        self.options = options
        self.clock = clock
        self.lock = threading.Lock()
        self.epoch = 1
        self.redis_ok = True  # the epoch watcher reached Redis last time

    # ---- effects and epoch ------------------------------------------------------------------
    def _apply(self) -> None:
        """Publish drained events and delete dropped bytes (caller holds the lock)."""
        self.store.apply(*self.tiers.drain())

    def check_epoch(self) -> bool:
        """If Redis lost our epoch key (restarted empty), clear all metadata. True if it did."""
        with self.lock:
            try:
                lost = self.store.lost_epoch()
            except redis.RedisError:
                self.redis_ok = False
                return False
            self.redis_ok = True
            if not lost:
                return False
            log.warning("Redis came back empty: clearing pool metadata (epoch %d -> %d)", self.epoch, self.epoch + 1)
            self.tiers.clear()
            self.epoch += 1
            self._apply()
            return True

    # ---- puts ------------------------------------------------------------------------------
    @_edge
    def BatchPutReserve(self, request: pb.ReserveRequest, context: grpc.ServicerContext) -> pb.ReserveReply:
        blocks = validate.reserve(request, self.options.max_blocks_per_request, self.options.max_block_bytes)
        parent = request.parent_hash if request.has_parent else None
        with self.lock:
            self.store.settle([b.block_hash for b in blocks])
            now = self.clock()
            res = self.tiers.reserve(blocks, request.owner, now, parent)
            self._apply()
        txn = res.txn if res.to_write else 0
        return pb.ReserveReply(txn=txn, statuses=[STATUS_TO_PB[s] for s in res.statuses],
                               tiers=[TIER_TO_PB[t] for t in res.tiers],
                               expires_in_s=res.expires_at - now, epoch=self.epoch)

    @_edge
    def BatchPutCommit(self, request: pb.CommitRequest, context: grpc.ServicerContext) -> pb.CommitReply:
        written = validate.written(request.written, self.options.max_blocks_per_request)
        hold = validate.hashes("hold", request.hold, self.options.max_blocks_per_request)
        with self.lock:
            now = self.clock()
            committed = self.tiers.commit(request.txn, now, written)
            self._apply()
            done = set(committed)
            orphans = [h for h in written if h not in done and not self.tiers.is_known(h)]
            self.store.apply([], orphans)  # bytes of reservations that expired before commit
            held = self.tiers.hold(hold, now) if hold else None
        if held is None:
            return pb.CommitReply(committed=committed)
        return pb.CommitReply(committed=committed, lease_id=held.lease_id,
                              held_tiers=[TIER_TO_PB[t] for t in held.tiers])

    @_edge
    def BatchPutAbort(self, request: pb.AbortRequest, context: grpc.ServicerContext) -> pb.AbortReply:
        with self.lock:
            self.tiers.abort(request.txn)
        return pb.AbortReply()

    # ---- reads -----------------------------------------------------------------------------
    @_edge
    def BatchGet(self, request: pb.GetRequest, context: grpc.ServicerContext) -> pb.GetReply:
        hashes = validate.hashes("block_hashes", request.block_hashes, self.options.max_blocks_per_request)
        with self.lock:
            found = self.tiers.lookup(hashes, self.clock(), lease=request.lease)
        return pb.GetReply(tiers=[TIER_TO_PB[t] for t in found.tiers], lease_id=found.lease_id,
                           lease_s=self.tiers.limits.lease_s, epoch=self.epoch)

    @_edge
    def Lease(self, request: pb.LeaseRequest, context: grpc.ServicerContext) -> pb.LeaseReply:
        hashes = validate.hashes("block_hashes", request.block_hashes, self.options.max_blocks_per_request)
        with self.lock:
            held = self.tiers.hold(hashes, self.clock())
        return pb.LeaseReply(lease_id=held.lease_id, held=sum(t is not None for t in held.tiers),
                             lease_s=self.tiers.limits.lease_s, tiers=[TIER_TO_PB[t] for t in held.tiers])

    @_edge
    def ReleaseLease(self, request: pb.ReleaseRequest, context: grpc.ServicerContext) -> pb.ReleaseReply:
        with self.lock:
            return pb.ReleaseReply(released=self.tiers.release(request.lease_id))

    @_edge
    def MatchPrefix(self, request: pb.MatchPrefixRequest, context: grpc.ServicerContext) -> pb.MatchPrefixReply:
        hashes = validate.hashes("block_hashes", request.block_hashes, self.options.max_blocks_per_request)
        with self.lock:
            match = self.tiers.match_prefix(hashes, self.clock())
        return pb.MatchPrefixReply(count=match.count, tiers=[TIER_TO_PB[t] for t in match.tiers])

    @_edge
    def Remove(self, request: pb.RemoveRequest, context: grpc.ServicerContext) -> pb.RemoveReply:
        hashes = validate.hashes("block_hashes", request.block_hashes, self.options.max_blocks_per_request)
        with self.lock:
            removed = self.tiers.remove(hashes)
            self._apply()
        return pb.RemoveReply(removed=removed)

    # ---- introspection ---------------------------------------------------------------------
    def Stats(self, request: pb.StatsRequest, context: grpc.ServicerContext) -> pb.StatsReply:
        with self.lock:
            return self.stats()

    def stats(self) -> pb.StatsReply:
        """Snapshot (caller holds the lock)."""
        c = self.tiers.counters
        tiers = [self._tier_stats(t) for t in ("pool_hbm", "pool_dram")]
        return pb.StatsReply(
            tiers=tiers, redis_bytes=self.tiers.actual_bytes, redis_budget_bytes=self.tiers.limits.budget_bytes,
            puts=c.puts, put_blocks=c.put_blocks, gets=c.gets, misses=c.misses, demotions=c.demotions,
            lease_expiries=c.lease_expiries, alloc_failures=c.alloc_failures, clears=c.clears,
            active_leases=self.tiers.active_leases, epoch=self.epoch)

    def _tier_stats(self, tier: PoolTier) -> pb.TierStats:
        u = self.tiers.usage(tier)
        c = self.tiers.counters
        return pb.TierStats(tier=TIER_TO_PB[tier], keys=u.keys, bytes=u.bytes, target_bytes=u.target_bytes,
                            capacity_bytes=u.capacity_bytes, evictions=c.evictions[tier], hits=c.hits[tier])

    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.HealthReply:
        return pb.HealthReply(serving=self.redis_ok and self.store.redis_ok, redis_url=self.options.redis_url,
                              key_prefix=self.options.key_prefix, event_stream=self.store.stream,
                              epoch=self.epoch, max_blocks_per_request=self.options.max_blocks_per_request)


class PoolServer:
    """A running pool: gRPC server + epoch watcher. `stop()` ends both."""

    def __init__(self, limits: PoolLimits, options: PoolOptions, host: str = "127.0.0.1", port: int = 0,
                 workers: int = 8, clock: Callable[[], float] = time.monotonic) -> None:
        client = redis.Redis.from_url(options.redis_url, socket_timeout=5.0, health_check_interval=0)
        self.store = PoolStore(client, options.key_prefix, options.event_stream)
        leftovers = self.store.claim()
        if leftovers:
            log.info("deleted %d block keys left by an earlier pool", leftovers)
        self.servicer = PoolServicer(PoolTiers(limits, epoch=time.time_ns()), self.store, options, clock)
        with self.servicer.lock:  # a fresh incarnation tells consumers to forget the old pool view
            self.servicer.tiers.clear()
            self.servicer._apply()
        msg_opts = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
        self.grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=msg_opts)
        pb_grpc.add_KVPoolServicer_to_server(self.servicer, self.grpc)
        self.port = self.grpc.add_insecure_port(f"{host}:{port}")
        if self.port == 0:
            raise RuntimeError(f"cannot bind {host}:{port}")
        self.address = f"{host}:{self.port}"
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="kvpool-epoch", daemon=True)

    def start(self) -> PoolServer:
        self.grpc.start()
        self._watcher.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(self.servicer.options.epoch_check_s):
            self.servicer.check_epoch()

    def stop(self, grace_s: float = 1.0) -> None:
        self._stop.set()
        self.grpc.stop(grace_s).wait()
        self._watcher.join(timeout=5.0)
        self.store.close()
        self.store.client.close()
