"""A Mooncake trace with its prompts written out as text (`text_input`), for outside load clients.

A Mooncake record names its prompt by hash ids, one per block of `block_size` tokens; a client
that builds the prompt itself (AIPerf's mooncake_trace loader) needs a tokenizer to do it, and
AIPerf 0.13's worker pool can load one only from the Hugging Face hub cache. With the text
already in the record it needs none. Each hash id always gives the same text, so records that
share hash ids share a prefix of the server's KV blocks; the byte tokenizer makes one ASCII
character one token, so a record's text is exactly `input_length` tokens.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path

from rackserve.workload.mooncake import TRACE_BLOCK_TOKENS, TraceRecord
from rackserve.workload.tokens import content_id, synth_tokens

ALPHABET = "abcdefghijklmnopqrstuvwxyz      "  # one byte, one token; spaces as in prose


def block_text(hash_id: int, length: int) -> str:
    """The first `length` characters of the text of `hash_id` (deterministic)."""
    picks = synth_tokens(content_id("mooncake-text", hash_id), 0, length, vocab=len(ALPHABET))
    return "".join(ALPHABET[i] for i in picks)


def record_text(record: TraceRecord, block_size: int = TRACE_BLOCK_TOKENS) -> str:
    """`input_length` characters: block_size per hash id, the last block cut to fit."""
    parts, left = [], record.input_length
    for hash_id in record.hash_ids:
        if left <= 0:
            break
        n = min(block_size, left)
        parts.append(block_text(hash_id, n))
        left -= n
    if left > 0:  # more tokens than hash ids cover: a tail of its own
        parts.append(block_text(content_id("tail", *record.hash_ids, record.input_length), left))
    return "".join(parts)


def read_records(path: str | Path, block_size: int = TRACE_BLOCK_TOKENS) -> list[TraceRecord]:
    """A Mooncake JSONL trace recorded at `block_size` tokens per hash id; a ValueError names
    the line and field of a bad record."""
    out = []
    for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        row = json.loads(line)
        for name in ("timestamp", "input_length", "output_length"):
            if isinstance(row.get(name), bool) or not isinstance(row.get(name), int | float):
                raise ValueError(f"{where}: field {name!r} must be a number")
        ids = row.get("hash_ids", [])
        if not isinstance(ids, list) or any(not isinstance(i, int) or i < 0 for i in ids):
            raise ValueError(f"{where}: field 'hash_ids' must be a list of non-negative integers")
        if len(ids) > math.ceil(row["input_length"] / block_size):
            raise ValueError(f"{where}: {len(ids)} hash ids are more than input_length "
                             f"{row['input_length']} covers at block size {block_size}")
        out.append(TraceRecord(float(row["timestamp"]), int(row["input_length"]),
                               int(row["output_length"]), tuple(ids)))
    return out


def text_trace(records: Iterable[TraceRecord], block_size: int = TRACE_BLOCK_TOKENS
               ) -> Iterator[str]:
    """The records as Mooncake JSONL lines with `text_input` (no hash ids, no input_length)."""
    for r in records:
        # AIPerf refuses input_length beside text_input: the text is the length
        row = {"timestamp": int(r.timestamp_ms), "output_length": r.output_length,
               "text_input": record_text(r, block_size)}
        yield json.dumps(row) + "\n"
