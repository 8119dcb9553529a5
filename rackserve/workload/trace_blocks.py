"""KV identity of replayed trace requests, vectorized: block ids and prompt tokens from hash ids.

The capture's hash ids are prefix identities (data/agentx/README.md: equal ids at equal positions
are the same prefix KV), so a target block's id needs no token hashing: it is a 64-bit mix of the
replay's salt (the per-lane cache-bust marker), its position and the trace id of the last trace
block it covers. With `scale` != 1 (the small live model) the prompt is `scale` times shorter and
position p of it stands for original position p / scale; prompt tokens are mixed the same way, so
equal trace prefixes give equal token prefixes (real prefix reuse in a live engine), and different
salts share nothing. Tokens past the last full trace block (the partial block) are unique per request
(`tail`). Cost: a few numpy passes over one uint64 per block (or per token for prompts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rackserve.workload.conversation import TRACE_BLOCK_TOKENS, common_prefix
from rackserve.workload.tokens import mix64

_POS = np.uint64(0xD6E8FEB86659FD93)  # odd 64-bit multipliers (from splitmix/xxhash constant families)
_ID = np.uint64(0x9E3779B97F4A7C15)
_TAIL_BIT = np.uint64(1 << 63)  # marks tail content so it never equals a trace id
_U64, _TAIL = 1 << 64, 1 << 63  # salts are 64-bit, tails below the tail bit (else: the numpy path)
_NONE = np.zeros(0, dtype=np.uint64)

try:  # the C pass (built by `pip install -e .`: setup.py); without a compiler, numpy does it all
    from rackserve.workload._blockids import fill as _fill
except ImportError:  # pragma: no cover - exercised where no C compiler is
    _fill = None


def trace_block_of(positions: np.ndarray, scale: float) -> np.ndarray:
    """Index of the trace block that position `positions` (of a prompt scaled by `scale`) stands for."""
    if scale == 1.0:
        return positions // TRACE_BLOCK_TOKENS
    return np.floor(positions / (scale * TRACE_BLOCK_TOKENS)).astype(np.int64)


def _content(hash_ids: np.ndarray, blocks: np.ndarray, tail: int) -> np.ndarray:
    """Trace id of each block index, or the request's own `tail` content past the last full block."""
    n = hash_ids.size
    if blocks.size and blocks[-1] < n:
        return hash_ids[blocks]
    inside = blocks < n
    out = np.full(blocks.size, np.uint64(tail) | _TAIL_BIT, dtype=np.uint64)
    out[inside] = hash_ids[blocks[inside]]
    return out


def _mix(content: np.ndarray, positions: np.ndarray, salt: int) -> np.ndarray:
    x = content * _ID  # uint64 array arithmetic wraps mod 2**64 (no warning for arrays)
    x += positions.astype(np.uint64) * _POS
    x += np.uint64(salt)
    return mix64(x)


def block_ids(hash_ids: np.ndarray, salt: int, prompt_tokens: int, block_tokens: int = 64,
              scale: float = 1.0, tail: int = 0) -> np.ndarray:  # fmt: skip
    """uint64 ids of the full `block_tokens` blocks of a (scaled) prompt of `prompt_tokens` tokens."""
    return next_block_ids(None, hash_ids, salt, prompt_tokens, block_tokens, scale, tail).ids


class BlockHashes(Sequence[int]):
    """A prompt's block ids as a read-only sequence of Python ints over their uint64 array, converted
    where read: the simulator reads a prompt's group keys (1 in kv_block_multiple) and a few blocks
    around its tail, so the ~1,600 ints of a 100k-token prompt are never all made (at 10,000 lanes,
    10,000 first prompts' tuples were 5 s of start-up). Equal to (and hashed as) the tuple it stands for."""

    __slots__ = ("_base", "_groups", "_ids", "_tuple")

    def __init__(self, ids: np.ndarray, base: tuple[BlockHashes, int] | None = None) -> None:
        """`base`: (the previous request's BlockHashes, how many leading ids this one shares with it)."""
        self._ids = ids
        self._tuple: tuple[int, ...] | None = None
        self._base = base
        self._groups: tuple[int, tuple[int, ...]] | None = None  # (group, group_keys(group))

    def group_keys(self, group: int) -> tuple[int, ...]:
        """self[group - 1 :: group] (the last id of every full group of `group` ids): those within the
        ids shared with the previous request are its own ints (an agentic turn resends its history),
        so only the new groups' are converted."""
        made = self._groups
        if made is not None and made[0] == group:
            return made[1]
        head: tuple[int, ...] = ()
        start = 0
        if self._base is not None:
            prev, keep = self._base
            had = prev._groups
            if had is not None and had[0] == group:
                k = keep // group  # key i is id (i + 1) * group - 1: shared while that is below keep
                head, start = had[1][:k], k * group
        new = tuple(self._ids[start + group - 1 :: group].tolist())
        keys = head + new if head else new
        self._groups, self._base = (group, keys), None  # the link is dropped once used
        return keys

    def __len__(self) -> int:
        return self._ids.shape[0]

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return tuple(self._ids[i].tolist())
        return self._ids.item(i)  # a Python int straight from the array (int(self._ids[i]) makes a numpy scalar first)

    def __iter__(self):
        return iter(self.as_tuple())

    def as_tuple(self) -> tuple[int, ...]:
        if self._tuple is None:
            self._tuple = tuple(self._ids.tolist())
        return self._tuple

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BlockHashes):
            other = other.as_tuple()
        return isinstance(other, tuple) and self.as_tuple() == other

    def __hash__(self) -> int:
        return hash(self.as_tuple())

    def __repr__(self) -> str:
        return f"BlockHashes({len(self)} blocks)"


@dataclass(frozen=True, eq=False)
class BlockIds:
    """One request's block ids (array and sequence of ints) and the trace hash ids they came from."""

    hash_ids: np.ndarray
    ids: np.ndarray
    as_tuple: Sequence[int]


def _kept(prev: BlockIds, hash_ids: np.ndarray, count: int, block_tokens: int, scale: float,
          common: int | None) -> int:  # fmt: skip
    """Leading blocks whose trace blocks (all <= their last) lie in the common trace prefix."""
    if common is None:
        common = common_prefix(prev.hash_ids, hash_ids)
    if scale == 1.0:  # last = ((j + 1) * B - 1) // 64 < common  <=>  j < 64 * common // B
        keep = common * TRACE_BLOCK_TOKENS // block_tokens
    else:
        j = np.arange(count, dtype=np.int64)
        keep = int(np.searchsorted(trace_block_of((j + 1) * block_tokens - 1, scale), common))
    return min(keep, count, prev.ids.size)


def next_block_ids(prev: BlockIds | None, hash_ids: np.ndarray, salt: int, prompt_tokens: int,
                   block_tokens: int = 64, scale: float = 1.0, tail: int = 0,
                   common: int | None = None) -> BlockIds:  # fmt: skip
    """`block_ids` of a request, reusing the ids of `prev`, the same agent's
    previous request under the same salt, for the blocks of their common trace prefix: an agentic
    turn mostly resends its predecessor, so only its new tail is mixed and converted. `common`:
    the common trace prefix with `prev` when known (Turn.shared_ids), else it is compared.
    Unscaled prompts of uint64 trace ids are filled in one C pass where it is built (_blockids.c:
    the same arithmetic as `next_block_ids_numpy`, its reference in the tests)."""
    if (_fill is None or scale != 1.0 or hash_ids.dtype != np.uint64 or not hash_ids.flags.c_contiguous
            or not 0 <= salt < _U64 or not 0 <= tail < _TAIL):  # fmt: skip
        return next_block_ids_numpy(prev, hash_ids, salt, prompt_tokens, block_tokens, scale, tail, common)
    count = prompt_tokens // block_tokens
    keep = 0 if prev is None else _kept(prev, hash_ids, count, block_tokens, scale, common)
    ids = np.empty(max(count, 0), dtype=np.uint64)
    _fill(ids, prev.ids if keep else _NONE, keep, hash_ids, salt, tail, block_tokens)
    base = (prev.as_tuple, keep) if keep and isinstance(prev.as_tuple, BlockHashes) else None
    return BlockIds(hash_ids, ids, BlockHashes(ids, base))


def next_block_ids_numpy(prev: BlockIds | None, hash_ids: np.ndarray, salt: int, prompt_tokens: int,
                         block_tokens: int = 64, scale: float = 1.0, tail: int = 0,
                         common: int | None = None) -> BlockIds:  # fmt: skip
    """next_block_ids in numpy: any scale (the reference of the C pass)."""
    count = prompt_tokens // block_tokens
    keep = 0 if prev is None else _kept(prev, hash_ids, count, block_tokens, scale, common)
    j = np.arange(keep, count, dtype=np.int64)
    if scale == 1.0 and block_tokens == TRACE_BLOCK_TOKENS:
        last = j  # block j is trace block j
    else:
        last = trace_block_of((j + 1) * block_tokens - 1, scale)  # its tokens depend on trace blocks <= last
    new = _mix(_content(hash_ids, last, tail), j, salt)
    ids = new if keep == 0 else np.concatenate([prev.ids[:keep], new])
    return BlockIds(hash_ids, ids, BlockHashes(ids))


def prompt_token_ids(hash_ids: np.ndarray, salt: int, prompt_tokens: int, scale: float = 1.0,
                     tail: int = 0, vocab: int = 256) -> np.ndarray:  # fmt: skip
    """The (scaled) prompt's token ids in [0, vocab): position p carries the content of trace block
    trace_block_of(p), so a shared trace prefix is a shared token prefix."""
    p = np.arange(prompt_tokens, dtype=np.int64)
    ids = _mix(_content(hash_ids, trace_block_of(p, scale), tail), p, salt)
    return (ids % np.uint64(vocab)).astype(np.int64)
