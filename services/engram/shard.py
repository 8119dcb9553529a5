"""One Engram shard: rows [start, stop) of both tables in memory, served over gRPC.

Rows are sharded by contiguous row-id ranges (`shard_range`), so a shard generates exactly its
slice with `LocalEngramTable.rows` and every shard layout gives bitwise the same rows.
"""

from __future__ import annotations

import functools
from concurrent import futures

import grpc
import numpy as np

from rackserve.model.config import ModelConfig
from rackserve.model.engram import NUM_TABLES, LocalEngramTable
from services._proto import engram_pb2 as pb
from services._proto import engram_pb2_grpc as pb_grpc

ROW_DTYPE = np.dtype("<f4")
ID_DTYPE = np.dtype("<i8")
MAX_ROWS_PER_REQUEST = 1 << 20
MAX_MESSAGE_BYTES = 256 * 1024**2


def shard_range(shard: int, shards: int, num_rows: int) -> tuple[int, int]:
    """Row ids [start, stop) held by `shard` of `shards` (contiguous, sizes differ by at most 1)."""
    if not 0 <= shard < shards:
        raise ValueError(f"shard must be in [0, {shards}), got {shard}")
    return shard * num_rows // shards, (shard + 1) * num_rows // shards


def shard_slices(cfg: ModelConfig, shard: int, shards: int) -> list[np.ndarray]:
    """This shard's rows of each table, float32 [stop - start, dim]."""
    start, stop = shard_range(shard, shards, cfg.engram_rows)
    # LocalEngramTable builds the whole table on construction; keep only our slice.
    full = LocalEngramTable(cfg)
    return [np.ascontiguousarray(full.rows(t, start, stop)) for t in range(NUM_TABLES)]


class ShardServicer(pb_grpc.EngramShardServicer):
    def __init__(self, cfg: ModelConfig, shard: int, shards: int) -> None:
        self.cfg = cfg
        self.shard, self.shards = shard, shards
        self.start, self.stop = shard_range(shard, shards, cfg.engram_rows)
        self.tables = shard_slices(cfg, shard, shards)

    def Lookup(self, request: pb.EngramLookupRequest, context: grpc.ServicerContext) -> pb.EngramLookupReply:
        problem = self._check(request)
        if problem:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        ids = np.frombuffer(request.row_ids, ID_DTYPE) - self.start
        rows = b"".join(self.tables[t][ids].astype(ROW_DTYPE, copy=False).tobytes() for t in _tables(request))
        return pb.EngramLookupReply(rows=rows, dim=self.cfg.engram_dim)

    def _check(self, request: pb.EngramLookupRequest) -> str:
        if request.table >= NUM_TABLES:
            return f"table: must be 0 or 1, got {request.table}"
        if any(t >= NUM_TABLES for t in request.tables):
            return f"tables: each must be 0 or 1, got {list(request.tables)}"
        if len(request.row_ids) % ID_DTYPE.itemsize:
            return f"row_ids: {len(request.row_ids)} bytes is not a whole number of int64"
        ids = np.frombuffer(request.row_ids, ID_DTYPE)
        if len(ids) > MAX_ROWS_PER_REQUEST:
            return f"row_ids: {len(ids)} rows, the limit is {MAX_ROWS_PER_REQUEST} per request"
        if len(ids) and (ids.min() < self.start or ids.max() >= self.stop):
            return f"row_ids: shard {self.shard} holds rows [{self.start}, {self.stop}), got [{ids.min()}, {ids.max()}]"
        return ""

    def Info(self, request: pb.EngramInfoRequest, context: grpc.ServicerContext) -> pb.EngramInfoReply:
        return pb.EngramInfoReply(shard=self.shard, shards=self.shards, row_start=self.start, row_stop=self.stop,
                                  num_rows=self.cfg.engram_rows, dim=self.cfg.engram_dim, seed=self.cfg.seed,
                                  max_rows_per_request=MAX_ROWS_PER_REQUEST)


def _tables(request: pb.EngramLookupRequest) -> list[int]:
    """The tables a request asks for, in reply order."""
    return list(request.tables) or [request.table]


@functools.cache
def _message_options() -> list[tuple[str, int]]:
    return [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]


class ShardServer:
    """A running shard (gRPC on host:port, 0 = free port)."""

    def __init__(self, cfg: ModelConfig, shard: int, shards: int, host: str = "127.0.0.1", port: int = 0,
                 workers: int = 4) -> None:
        self.servicer = ShardServicer(cfg, shard, shards)
        self.grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=_message_options())
        pb_grpc.add_EngramShardServicer_to_server(self.servicer, self.grpc)
        self.port = self.grpc.add_insecure_port(f"{host}:{port}")
        if self.port == 0:
            raise RuntimeError(f"cannot bind {host}:{port}")
        self.address = f"{host}:{self.port}"

    def start(self) -> ShardServer:
        self.grpc.start()
        return self

    def stop(self, grace_s: float = 1.0) -> None:
        self.grpc.stop(grace_s).wait()
