"""Mooncake JSONL traces: read and validate records, turn them into Requests with 64-token hashes.

Each line: {"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]} with one
hash id per 512-token block (the last one may be partial). Tokens are synthesized per hash id so
equal ids give equal blocks at any target block size.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from rackserve.kv.block_hash import root_hash
from rackserve.workload.request import Request
from rackserve.workload.tokens import content_id, synth_token_rows, synth_tokens
from rackserve.workload.trace_file import open_trace

TRACE_BLOCK_TOKENS = 512  # Mooncake's hash_ids granularity (kvcache-ai/Mooncake FAST25-release)
_U32_LE = np.dtype("<u4")  # block_hash.py's token bytes


@dataclass(frozen=True)
class TraceRecord:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _int_field(obj: dict, name: str, where: str, minimum: int) -> int:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: field '{name}' must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{where}: field '{name}' must be >= {minimum}, got {value}")
    return value


def parse_record(line: str, where: str) -> TraceRecord:
    """Parse one JSONL line; ValueError names the line (`where`) and the bad field."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    ts = obj.get("timestamp")
    if isinstance(ts, bool) or not isinstance(ts, int | float) or ts < 0:
        raise ValueError(f"{where}: field 'timestamp' must be a number >= 0 (ms), got {ts!r}")
    n_in = _int_field(obj, "input_length", where, 1)
    n_out = _int_field(obj, "output_length", where, 1)
    ids = obj.get("hash_ids")
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in ids):
        raise ValueError(f"{where}: field 'hash_ids' must be a list of non-negative integers")
    expected = math.ceil(n_in / TRACE_BLOCK_TOKENS)
    if len(ids) != expected:
        raise ValueError(
            f"{where}: field 'hash_ids' has {len(ids)} ids, input_length {n_in} needs {expected}"
        )
    return TraceRecord(float(ts), n_in, n_out, tuple(ids))


def read_trace(path: str | Path, limit: int | None = None) -> list[TraceRecord]:
    """All records of a trace file, plain or gzip (blank lines skipped), in file order."""
    out: list[TraceRecord] = []
    with open_trace(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            if limit is not None and len(out) >= limit:
                break
            if line.strip():
                out.append(parse_record(line.decode(), f"{path}:{lineno}"))
    return out


def _check_order(records: list[TraceRecord]) -> None:
    for i in range(1, len(records)):
        if records[i].timestamp_ms < records[i - 1].timestamp_ms:
            raise ValueError(f"trace record {i + 1}: field 'timestamp' goes backwards")


class TraceHasher:
    """Hashes trace prompts at the target block size, memoizing per (parent hash, hash id, tokens).

    A record's chunks are looked up in order until the first miss; every later chunk misses too (its
    parent is a hash just made), so their tokens are synthesized in one array pass and hashed from one
    buffer: the same tokens and hashes as synth_tokens + block_hashes per chunk (tested), a few numpy
    calls per record instead of per 512-token chunk."""

    def __init__(self, block_size: int, model_id: str) -> None:
        self.block_size = block_size
        self.model_id = model_id
        self._root = root_hash(model_id)
        self._memo: dict[tuple[int, int, int], list[int]] = {}

    def hashes(self, record: TraceRecord) -> tuple[int, ...]:
        assert TRACE_BLOCK_TOKENS % self.block_size == 0, "target block must divide 512"
        parent = self._root
        out: list[int] = []
        ids, length, memo = record.hash_ids, record.input_length, self._memo
        for i, hid in enumerate(ids):
            n = min(TRACE_BLOCK_TOKENS, length - i * TRACE_BLOCK_TOKENS)
            chunk = memo.get((parent, hid, n))
            if chunk is None:
                self._hash_rest(record, i, parent, out)
                break
            out.extend(chunk)
            if n < TRACE_BLOCK_TOKENS or not chunk:
                break
            parent = chunk[-1]
        return tuple(out)

    def _hash_rest(self, record: TraceRecord, first: int, parent: int, out: list[int]) -> None:
        """Chunks first.. of a record (none of them memoized), appended to `out` and memoized."""
        ids = record.hash_ids[first:]
        cids = np.fromiter((xxhash.xxh3_64_intdigest(b"mooncake/%d" % h) for h in ids), np.uint64, len(ids))
        toks = synth_token_rows(cids, TRACE_BLOCK_TOKENS)  # == content_id("mooncake", h): "/".join of its parts
        body = toks.astype(_U32_LE, copy=False).tobytes()
        step = self.block_size * 4  # bytes of one target block
        per_chunk = TRACE_BLOCK_TOKENS // self.block_size
        memo, digest = self._memo, xxhash.xxh3_64_intdigest
        for j, hid in enumerate(ids):
            n = min(TRACE_BLOCK_TOKENS, record.input_length - (first + j) * TRACE_BLOCK_TOKENS)
            base = j * TRACE_BLOCK_TOKENS * 4
            chunk = []
            for b in range(n // self.block_size if n < TRACE_BLOCK_TOKENS else per_chunk):
                off = base + b * step
                parent_of = parent if not chunk else chunk[-1]
                chunk.append(digest(parent_of.to_bytes(8, "little") + body[off:off + step]))
            memo[(parent, hid, n)] = chunk
            out.extend(chunk)
            if n < TRACE_BLOCK_TOKENS or not chunk:
                return
            parent = chunk[-1]


def trace_requests(
    records: Iterable[TraceRecord], block_size: int = 64, model_id: str = "deepseek-v4.1-flash",
    time_scale: float = 1.0,
) -> list[Request]:
    """Requests in arrival order; `time_scale` multiplies inter-arrival times (0.5 = twice the rate)."""
    records = list(records)
    _check_order(records)
    hasher = TraceHasher(block_size, model_id)
    t0 = records[0].timestamp_ms if records else 0.0
    return [
        Request(i, (r.timestamp_ms - t0) / 1000.0 * time_scale, r.input_length, r.output_length, hasher.hashes(r))
        for i, r in enumerate(records)
    ]


def iter_prompt_tokens(record: TraceRecord) -> Iterator[int]:
    """The synthesized prompt tokens of a record (for the live cluster, which needs real tokens)."""
    for i, hid in enumerate(record.hash_ids):
        n = min(TRACE_BLOCK_TOKENS, record.input_length - i * TRACE_BLOCK_TOKENS)
        yield from synth_tokens(content_id("mooncake", hid), 0, n).tolist()
