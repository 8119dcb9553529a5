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

import numpy as np

from rackserve.workload.conversation import TRACE_BLOCK_TOKENS
from rackserve.workload.tokens import mix64

_POS = np.uint64(0xD6E8FEB86659FD93)  # odd 64-bit multipliers (from splitmix/xxhash constant families)
_ID = np.uint64(0x9E3779B97F4A7C15)
_TAIL_BIT = np.uint64(1 << 63)  # marks tail content so it never equals a trace id


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
    with np.errstate(over="ignore"):
        x = content * _ID + positions.astype(np.uint64) * _POS + np.uint64(salt)
    return mix64(x)


def block_ids(hash_ids: np.ndarray, salt: int, prompt_tokens: int, block_tokens: int = 64,
              scale: float = 1.0, tail: int = 0) -> np.ndarray:  # fmt: skip
    """uint64 ids of the full `block_tokens` blocks of a (scaled) prompt of `prompt_tokens` tokens."""
    j = np.arange(prompt_tokens // block_tokens, dtype=np.int64)
    last = trace_block_of((j + 1) * block_tokens - 1, scale)  # its tokens depend on trace blocks <= last
    return _mix(_content(hash_ids, last, tail), j, salt)


def prompt_token_ids(hash_ids: np.ndarray, salt: int, prompt_tokens: int, scale: float = 1.0,
                     tail: int = 0, vocab: int = 256) -> np.ndarray:  # fmt: skip
    """The (scaled) prompt's token ids in [0, vocab): position p carries the content of trace block
    trace_block_of(p), so a shared trace prefix is a shared token prefix."""
    p = np.arange(prompt_tokens, dtype=np.int64)
    ids = _mix(_content(hash_ids, trace_block_of(p, scale), tail), p, salt)
    return (ids % np.uint64(vocab)).astype(np.int64)
