"""Checks on pool requests at the gRPC edge: a bad field gives INVALID_ARGUMENT naming it."""

from __future__ import annotations

from collections.abc import Sequence

from rackserve.kv.pool_tiers import BlockPut

MAX_OWNER_CHARS = 256


class InvalidRequest(ValueError):
    """A request field is malformed; the message names it."""


def count(field: str, values: Sequence[object], max_blocks: int) -> None:
    if len(values) > max_blocks:
        raise InvalidRequest(f"{field}: {len(values)} entries, the limit is {max_blocks} per request")


def no_duplicates(field: str, hashes: Sequence[int]) -> None:
    seen: dict[int, int] = {}
    for i, h in enumerate(hashes):
        if h in seen:
            raise InvalidRequest(f"{field}[{i}] repeats {field}[{seen[h]}] (block hash {h:#018x})")
        seen[h] = i


def reserve(request: object, max_blocks: int, max_block_bytes: int) -> list[BlockPut]:
    """Validate a ReserveRequest; returns its blocks."""
    owner = request.owner  # type: ignore[attr-defined]
    blocks = request.blocks  # type: ignore[attr-defined]
    if not owner or len(owner) > MAX_OWNER_CHARS:
        raise InvalidRequest(f"owner: must be 1-{MAX_OWNER_CHARS} characters, got {len(owner)}")
    count("blocks", blocks, max_blocks)
    no_duplicates("blocks.block_hash", [b.block_hash for b in blocks])
    for i, b in enumerate(blocks):
        if not 0 < b.size <= max_block_bytes:
            raise InvalidRequest(f"blocks[{i}].size: must be 1-{max_block_bytes} bytes, got {b.size}")
    return [BlockPut(b.block_hash, b.size, b.target_size) for b in blocks]


def hashes(field: str, values: Sequence[int], max_blocks: int, unique: bool = False) -> list[int]:
    count(field, values, max_blocks)
    if unique:
        no_duplicates(field, values)
    return list(values)
