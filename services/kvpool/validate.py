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
    if len(set(hashes)) == len(hashes):
        return
    seen: dict[int, int] = {}
    for i, h in enumerate(hashes):
        if h in seen:
            raise InvalidRequest(f"{field}[{i}] repeats {field}[{seen[h]}] (block hash {h:#018x})")
        seen[h] = i


def reserve(request: object, max_blocks: int, max_block_bytes: int) -> list[BlockPut]:
    """Validate a ReserveRequest; returns its blocks."""
    owner: str = request.owner  # type: ignore[attr-defined]
    hashes: Sequence[int] = request.block_hashes  # type: ignore[attr-defined]
    sizes: Sequence[int] = request.sizes  # type: ignore[attr-defined]
    targets: Sequence[int] = request.target_sizes or [0] * len(sizes)  # type: ignore[attr-defined]
    if not owner or len(owner) > MAX_OWNER_CHARS:
        raise InvalidRequest(f"owner: must be 1-{MAX_OWNER_CHARS} characters, got {len(owner)}")
    count("block_hashes", hashes, max_blocks)
    if not len(sizes) == len(targets) == len(hashes):
        raise InvalidRequest(f"sizes ({len(sizes)}) and target_sizes ({len(request.target_sizes)}, or 0) "  # type: ignore[attr-defined]
                             f"must match block_hashes ({len(hashes)})")
    no_duplicates("block_hashes", hashes)
    if sizes and not 0 < min(sizes) <= max(sizes) <= max_block_bytes:
        i = next(i for i, n in enumerate(sizes) if not 0 < n <= max_block_bytes)
        raise InvalidRequest(f"sizes[{i}]: must be 1-{max_block_bytes} bytes, got {sizes[i]}")
    return [BlockPut(h, n, t) for h, n, t in zip(hashes, sizes, targets, strict=True)]


def hashes(field: str, values: Sequence[int], max_blocks: int, unique: bool = False) -> list[int]:
    count(field, values, max_blocks)
    if unique:
        no_duplicates(field, values)
    return list(values)


def written(values: Sequence[int], max_blocks: int) -> list[int]:
    """A commit's `written` hashes: at least one (commit nothing by aborting), none repeated."""
    if not values:
        raise InvalidRequest("written: empty; name the blocks whose bytes were written "
                             "(BatchPutAbort releases a reservation)")
    return hashes("written", values, max_blocks, unique=True)
