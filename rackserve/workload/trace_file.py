"""Trace files on disk: plain or gzip JSONL (told apart by the gzip magic bytes), the two formats
(Mooncake records, recorded agentic conversations) told apart by content, and a fast reader for
conversations.

`trace_format(path)` -> "mooncake" | "conversation" from the first non-blank line.
`read_conversations(path)` parses each line once per process (memoized on path, size and mtime):
hash-id lists are cut out with one regex and read by numpy, the rest goes through `json`
(about 5x faster than `json.loads` on the whole 224 MB of the dev file).
"""

from __future__ import annotations

import gzip
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import IO

import numpy as np

from rackserve.workload.conversation import Conversation, parse_conversation

GZIP_MAGIC = b"\x1f\x8b"
_HASH_IDS = re.compile(rb'"hash_ids"\s*:\s*\[([^\]]*)\]')


def open_trace(path: str | Path) -> IO[bytes]:
    """Binary reader of a trace file, gunzipping when the file starts with the gzip magic."""
    path = Path(path)
    with path.open("rb") as fh:
        magic = fh.read(2)
    return gzip.open(path, "rb") if magic == GZIP_MAGIC else path.open("rb")


def read_lines(path: str | Path) -> list[bytes]:
    with open_trace(path) as fh:
        return fh.read().splitlines()


def trace_format(path: str | Path) -> str:
    """"conversation" (has `requests`) or "mooncake" (has `timestamp` + `hash_ids`), by content."""
    with open_trace(path) as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            head = raw if len(raw) < 4096 else _HASH_IDS.sub(b'"hash_ids":[]', raw)
            try:
                obj = json.loads(head)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            if isinstance(obj, dict) and "requests" in obj:
                return "conversation"
            if isinstance(obj, dict) and "timestamp" in obj and "hash_ids" in obj:
                return "mooncake"
            raise ValueError(
                f"{path}:{lineno}: neither a Mooncake record (timestamp, hash_ids) nor a recorded "
                "conversation (requests)"
            )
    raise ValueError(f"{path}: the trace is empty")


def _parse_ids(text: bytes, where: str) -> np.ndarray:
    if not text.strip():
        return np.zeros(0, dtype=np.int64)
    try:
        arr = np.fromstring(text.decode(), dtype=np.int64, sep=",")  # text mode: not deprecated
    except ValueError:
        arr = np.zeros(0, dtype=np.int64)
    if arr.size != text.count(b",") + 1:
        raise ValueError(f"{where}: field 'hash_ids' must be a list of integers")
    return arr


def parse_line(line: bytes, where: str) -> Conversation:
    arrays: list[np.ndarray] = []

    def cut(m: re.Match) -> bytes:
        arrays.append(_parse_ids(m.group(1), where))
        return b'"hash_ids":{"@ids":%d}' % (len(arrays) - 1)

    try:
        obj = json.loads(_HASH_IDS.sub(cut, line))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc.msg})") from None
    _restore(obj, arrays)
    return parse_conversation(obj, where)


def _restore(obj: object, arrays: list[np.ndarray]) -> None:
    """Put the cut-out hash-id arrays back where their placeholders are."""
    if isinstance(obj, dict):
        ids = obj.get("hash_ids")
        if isinstance(ids, dict) and "@ids" in ids:
            obj["hash_ids"] = arrays[ids["@ids"]]
        for value in obj.values():
            if isinstance(value, list):
                for item in value:
                    _restore(item, arrays)


@lru_cache(maxsize=4)
def _read(path: str, _size: int, _mtime_ns: int, limit: int | None) -> tuple[Conversation, ...]:
    out: list[Conversation] = []
    for lineno, line in enumerate(read_lines(path), start=1):
        if limit is not None and len(out) >= limit:
            break
        if line.strip():
            out.append(parse_line(line, f"{path}:{lineno}"))
    if not out:
        raise ValueError(f"{path}: no conversations")
    return tuple(out)


def read_conversations(path: str | Path, limit: int | None = None) -> tuple[Conversation, ...]:
    """Every conversation of a file (the first `limit`), in file order; immutable, so shared."""
    st = Path(path).stat()
    return _read(str(Path(path).resolve()), st.st_size, st.st_mtime_ns, limit)
