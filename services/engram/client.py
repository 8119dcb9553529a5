"""ShardedEngramTable: the `EngramTable` of the cluster, fanning each lookup out to N shards.

Row ids are deduplicated, split by shard range, fetched from all shards in parallel (one
pool thread per shard call) and scattered back, so `lookup(table, ids)` equals `LocalEngramTable.lookup` bitwise.
`prefetch` starts a lookup early (Engram rows depend on token ids only) and returns a future.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import grpc
import numpy as np

from rackserve.model.config import ModelConfig
from rackserve.model.engram import NUM_TABLES, engram_row_ids
from services._proto import engram_pb2 as pb
from services._proto import engram_pb2_grpc as pb_grpc
from services.engram.row_cache import RowCache
from services.engram.shard import ID_DTYPE, MAX_MESSAGE_BYTES, ROW_DTYPE


class EngramUnavailable(RuntimeError):
    """A shard did not answer: the layer cannot run without its rows."""


class ShardedEngramTable:
    """Client of shards 0..N-1 (any order of addresses); checks they tile [0, num_rows)."""

    def __init__(self, addresses: Sequence[str], cfg: ModelConfig | None = None, timeout_s: float = 10.0,
                 cache_rows: int = 0) -> None:
        """`cache_rows`: rows per table kept from earlier lookups (services/engram/row_cache.py)."""
        self.cfg = cfg
        self.timeout_s = timeout_s
        opts = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
        channels = [grpc.insecure_channel(a, options=opts) for a in addresses]
        stubs = [pb_grpc.EngramShardStub(c) for c in channels]
        infos = [s.Info(pb.EngramInfoRequest(), timeout=timeout_s, wait_for_ready=True) for s in stubs]
        order = sorted(range(len(infos)), key=lambda i: infos[i].shard)
        self._channels = [channels[i] for i in order]
        self._stubs = [stubs[i] for i in order]
        infos = [infos[i] for i in order]
        _check_layout(infos, cfg)
        self.num_rows = int(infos[0].num_rows)
        self.dim = int(infos[0].dim)
        self._starts = np.array([i.row_start for i in infos], dtype=np.int64)
        self._prefetcher = ThreadPoolExecutor(max_workers=2, thread_name_prefix="engram-prefetch")
        self._fanout = ThreadPoolExecutor(max_workers=2 * len(self._stubs), thread_name_prefix="engram-fanout")
        self._caches = [RowCache(cache_rows, self.dim) for _ in range(NUM_TABLES)] if cache_rows else None

    @property
    def shards(self) -> int:
        return len(self._stubs)

    def row_ids(self, token_ids: np.ndarray) -> np.ndarray:
        """[L, H] row ids of a token sequence (the deterministic helper of rackserve.model.engram)."""
        if self.cfg is None:
            raise ValueError("row_ids needs the ModelConfig: pass cfg to ShardedEngramTable")
        return engram_row_ids(token_ids, self.cfg)

    def lookup(self, table: int, row_ids: np.ndarray) -> np.ndarray:
        """Rows of `table` for `row_ids[...]` -> float32 [..., dim], fetched from all shards at once."""
        if table not in range(NUM_TABLES):
            raise ValueError(f"table must be 0 or 1, got {table}")
        return self._lookup_tables((table,), row_ids)[0]

    def lookup_all(self, row_ids: np.ndarray) -> list[np.ndarray]:
        """Both tables' rows in one fan-out round (every shard call of both tables at once)."""
        return self._lookup_tables(tuple(range(NUM_TABLES)), row_ids)

    def _lookup_tables(self, tables: tuple[int, ...], row_ids: np.ndarray) -> list[np.ndarray]:
        ids = np.asarray(row_ids)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_rows):
            raise ValueError(f"row_ids must lie in [0, {self.num_rows})")
        unique, inverse = np.unique(ids.astype(np.int64).reshape(-1), return_inverse=True)
        rows = np.empty((len(tables), len(unique), self.dim), dtype=np.float32)
        cached = self._cached(tables, unique)
        for i, t in enumerate(tables) if cached.any() else ():
            rows[i, cached] = self._caches[t].get(unique[cached])  # type: ignore[index]
        missing = unique[~cached]
        rows[:, ~cached] = self._fetch(tables, missing)
        for i, t in enumerate(tables) if self._caches is not None and len(missing) else ():
            self._caches[t].put(missing, rows[i, ~cached])
        return [rows[i][inverse].reshape(ids.shape + (self.dim,)) for i in range(len(tables))]

    def _cached(self, tables: tuple[int, ...], unique: np.ndarray) -> np.ndarray:
        """Mask of the ids whose rows every table of `tables` has cached."""
        if self._caches is None:
            return np.zeros(len(unique), dtype=bool)
        return np.logical_and.reduce([self._caches[t].hits(unique) for t in tables])

    def _fetch(self, tables: tuple[int, ...], unique: np.ndarray) -> np.ndarray:
        """[tables, ids, dim] rows of sorted unique ids from the shards (one call per shard)."""
        parts = np.split(unique, np.searchsorted(unique, self._starts[1:]))
        calls = [(len(p), self._fanout.submit(self._call, s, tables, p)) for s, p in enumerate(parts) if len(p)]
        rows = np.empty((len(tables), len(unique), self.dim), dtype=np.float32)
        at = 0
        for n, call in calls:
            rows[:, at : at + n] = np.frombuffer(call.result().rows, ROW_DTYPE).reshape(len(tables), n, self.dim)
            at += n
        return rows

    def prefetch(self, table: int, row_ids: np.ndarray) -> Future[np.ndarray]:
        """Start `lookup` now; `.result()` when the layer needs the rows."""
        return self._prefetcher.submit(self.lookup, table, np.array(row_ids, copy=True))

    def _call(self, shard: int, tables: tuple[int, ...], ids: np.ndarray) -> pb.EngramLookupReply:
        """One shard's blocking call for `tables` (run on a pool thread: cheaper than a gRPC future
        per call)."""
        request = pb.EngramLookupRequest(tables=tables, row_ids=ids.astype(ID_DTYPE).tobytes())
        try:
            return self._stubs[shard].Lookup(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:  # type: ignore[attr-defined]
                raise ValueError(exc.details()) from None  # type: ignore[attr-defined]
            raise EngramUnavailable(f"engram shard failed: {exc.code()} {exc.details()}") from None  # type: ignore[attr-defined]

    def close(self) -> None:
        self._prefetcher.shutdown(wait=False)
        self._fanout.shutdown(wait=False)
        for channel in self._channels:
            channel.close()

    def __enter__(self) -> ShardedEngramTable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_layout(infos: list[pb.EngramInfoReply], cfg: ModelConfig | None) -> None:
    """Shards 0..N-1 of one table shape that tile [0, num_rows) without gaps."""
    n = len(infos)
    first = infos[0]
    if [i.shard for i in infos] != list(range(n)) or any(i.shards != n for i in infos):
        raise ValueError(f"engram shards: expected shards 0..{n - 1} of {n}, got {[(i.shard, i.shards) for i in infos]}")
    for a, b in zip(infos, infos[1:], strict=False):
        if a.row_stop != b.row_start:
            raise ValueError(f"engram shards: rows of shard {a.shard} end at {a.row_stop}, shard {b.shard} starts at {b.row_start}")
    same = {(i.num_rows, i.dim, i.seed) for i in infos}
    if len(same) != 1 or first.row_start != 0 or infos[-1].row_stop != first.num_rows:
        raise ValueError(f"engram shards disagree on (rows, dim, seed) or coverage: {sorted(same)}")
    if cfg is not None and (first.num_rows, first.dim, first.seed) != (cfg.engram_rows, cfg.engram_dim, cfg.seed):
        raise ValueError(f"engram shards hold (rows, dim, seed) = {(first.num_rows, first.dim, first.seed)}, "
                         f"the model expects {(cfg.engram_rows, cfg.engram_dim, cfg.seed)}")
