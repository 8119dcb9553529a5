"""Engram: hashed n-gram embedding tables, addressed by token ids alone (so lookups can be prefetched).

Three pieces, so a remote (sharded) service can replace the in-process table:
- `engram_row_ids(token_ids, cfg)`: PURE. For every position i, one row id per (n-gram size, hash
  head) from the n-gram ending at i (tokens <= i only). Result [L, H] int64, H = cfg.engram_heads,
  column order: n-gram sizes in cfg.engram_ngrams order, hash heads 0..k-1 within each.
- `EngramTable` (Protocol): `lookup(table, row_ids[..., H]) -> float32[..., H, D]`; table 0/1 are
  the tables of the model's two Engram layers (cfg.engram_layers[0] / [1]).
- `LocalEngramTable(cfg, seed)`: the in-process table. `rows(table, start, stop)` generates any row
  range on its own and always gives identical values, so a shard can hold rows [start, stop) only.

Hash specification (everything unsigned 64-bit, wrapping):
    seed(n, h) = mix64(0x5EED0000 + 256 * n + h)
    acc = seed(n, h); for each token t of the n-gram, oldest first: acc = (acc ^ (t + 1)) * 0x100000001B3
    row = mix64(acc) % num_rows
where mix64 is the SplitMix64 finalizer (z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27;
z *= 0x94D049BB133111EB; z ^= z >> 31). Positions before the sequence start read token 0xFFFFFFFF.

Row values: rows are generated in chunks of ROW_CHUNK rows; chunk c of table t is
np.random.default_rng([seed, t, c]).standard_normal((ROW_CHUNK, dim), float32) * ROW_SCALE.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from rackserve.model.config import ModelConfig

FNV_PRIME = np.uint64(0x100000001B3)
SEED_BASE = 0x5EED0000
PAD_TOKEN = 0xFFFFFFFF  # stands for positions before the sequence start; no real token id
ROW_CHUNK = 4096
ROW_SCALE = 0.5
NUM_TABLES = 2


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64 finalizer over a uint64 array (wrapping arithmetic)."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def hash_seed(n: int, head: int) -> int:
    """The documented seed of hash head `head` for n-grams of size `n`."""
    return int(_mix64(np.array([SEED_BASE + 256 * n + head], dtype=np.uint64))[0])


@functools.cache
def _seeds(ngrams: tuple[int, ...], heads: int) -> np.ndarray:
    return np.array([[hash_seed(n, h) for h in range(heads)] for n in ngrams], dtype=np.uint64)


def engram_windows(
    token_ids: Sequence[int] | np.ndarray, start: int, stop: int, cfg: ModelConfig
) -> np.ndarray:
    """[stop - start, longest n-gram] the tokens ending at each position in [start, stop), oldest
    first, PAD_TOKEN before the sequence start. Reads only token_ids[start - longest + 1 : stop]."""
    longest = max(cfg.engram_ngrams)
    if stop <= start:
        return np.empty((0, longest), np.int64)
    lo = max(0, start - (longest - 1))
    tokens = np.asarray(token_ids[lo:stop], dtype=np.int64)
    pad = np.full(longest - 1 - (start - lo), PAD_TOKEN, np.int64)
    return np.lib.stride_tricks.sliding_window_view(np.concatenate([pad, tokens]), longest)


def engram_row_ids_windows(windows: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """Row ids [N, H] int64 from N windows of `engram_windows` (any positions, any sequences)."""
    longest = max(cfg.engram_ngrams)
    w = np.asarray(windows, dtype=np.int64).astype(np.uint64) + np.uint64(1)
    assert w.ndim == 2 and w.shape[1] == longest, "windows must be [N, longest n-gram]"
    seeds = _seeds(tuple(cfg.engram_ngrams), cfg.engram_heads_per_ngram)
    columns = []
    for i, n in enumerate(cfg.engram_ngrams):
        acc = np.repeat(seeds[i][None, :], len(w), axis=0)  # [N, heads]
        for j in range(longest - n, longest):  # oldest token of the n-gram first
            acc ^= w[:, j : j + 1]
            acc *= FNV_PRIME
        columns.append(acc)
    rows = _mix64(np.concatenate(columns, axis=1)) % np.uint64(cfg.engram_rows)
    return rows.astype(np.int64)


def engram_row_ids(token_ids: Sequence[int] | np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """Row ids [L, H] int64 for every position of `token_ids` (position 0 = sequence start)."""
    tokens = np.asarray(token_ids, dtype=np.int64)
    if tokens.ndim != 1:
        raise ValueError(f"token_ids must be 1-D, got shape {tokens.shape}")
    return engram_row_ids_windows(engram_windows(tokens, 0, len(tokens), cfg), cfg)


def engram_row_ids_span(
    token_ids: Sequence[int] | np.ndarray, start: int, stop: int, cfg: ModelConfig
) -> np.ndarray:
    """Rows for positions [start, stop) of a sequence, reading only the tokens those n-grams need."""
    return engram_row_ids_windows(engram_windows(token_ids, start, stop, cfg), cfg)


@runtime_checkable
class EngramTable(Protocol):
    """Where Engram rows come from: in-process (`LocalEngramTable`) or a remote sharded service."""

    num_rows: int
    dim: int

    def lookup(self, table: int, row_ids: np.ndarray) -> np.ndarray:
        """Rows of `table` (0 or 1) for `row_ids[..., H]` -> float32 [..., H, dim]."""
        ...

    def lookup_all(self, row_ids: np.ndarray) -> list[np.ndarray]:
        """`lookup` of every table (in table order) for the same ids: one round trip when remote."""
        ...


class LocalEngramTable:
    """Both Engram tables held in this process, generated from a seed."""

    def __init__(self, cfg: ModelConfig, seed: int | None = None) -> None:
        self.num_rows = cfg.engram_rows
        self.dim = cfg.engram_dim
        self.seed = cfg.seed if seed is None else seed
        self._tables = [self.rows(t, 0, self.num_rows) for t in range(NUM_TABLES)]

    def rows(self, table: int, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of `table` as float32 [stop - start, dim]; identical for any range."""
        if table not in range(NUM_TABLES):
            raise ValueError(f"table must be 0 or 1, got {table}")
        if not 0 <= start <= stop <= self.num_rows:
            raise ValueError(f"row range [{start}, {stop}) outside [0, {self.num_rows})")
        first, last = start // ROW_CHUNK, (stop + ROW_CHUNK - 1) // ROW_CHUNK
        chunks = [self._chunk(table, c) for c in range(first, last)]
        if not chunks:
            return np.zeros((0, self.dim), np.float32)
        block = np.concatenate(chunks)
        return block[start - first * ROW_CHUNK : stop - first * ROW_CHUNK]

    def _chunk(self, table: int, chunk: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, table, chunk])
        values = rng.standard_normal((ROW_CHUNK, self.dim), dtype=np.float32)
        values *= np.float32(ROW_SCALE)
        return values

    def lookup(self, table: int, row_ids: np.ndarray) -> np.ndarray:
        if table not in range(NUM_TABLES):
            raise ValueError(f"table must be 0 or 1, got {table}")
        ids = np.asarray(row_ids)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_rows):
            raise ValueError(f"row_ids must lie in [0, {self.num_rows})")
        return self._tables[table][ids]

    def lookup_all(self, row_ids: np.ndarray) -> list[np.ndarray]:
        return [self.lookup(t, row_ids) for t in range(NUM_TABLES)]
