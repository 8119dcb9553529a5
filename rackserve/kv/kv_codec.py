"""Bytes of one KV block (all layers, K and V): the format of the KV pool and of P->D transfers.

Layout (little-endian): a 32-byte header, then K then V as C-ordered float32 [n_layers, block_size,
head_dim] arrays.
    magic b"RSKV" | version u16 | dtype code u8 | pad u8 | n_layers u32 | block_size u32 |
    head_dim u32 | model fingerprint u64 | payload bytes u32
A reader refuses (ValueError) any other magic, version, dtype, shape or model fingerprint, and a
truncated or overlong payload.
"""

from __future__ import annotations

import struct

import numpy as np

MAGIC = b"RSKV"
VERSION = 1
_HEADER = struct.Struct("<4sHBxIIIQI")
_DTYPES = {1: np.dtype("<f4")}
_DTYPE_CODES = {v: k for k, v in _DTYPES.items()}
HEADER_BYTES = _HEADER.size


def encode_block(k: np.ndarray, v: np.ndarray, fingerprint: int) -> bytes:
    """Serialize one block's K and V ([n_layers, block_size, head_dim] float32 each)."""
    assert k.shape == v.shape and k.ndim == 3, "K and V must be [n_layers, block_size, head_dim]"
    dtype = np.dtype("<f4")
    payload = np.ascontiguousarray(k, dtype).tobytes() + np.ascontiguousarray(v, dtype).tobytes()
    header = _HEADER.pack(MAGIC, VERSION, _DTYPE_CODES[dtype], *k.shape, fingerprint, len(payload))
    return header + payload


def decode_block(
    data: bytes, shape: tuple[int, int, int], fingerprint: int
) -> tuple[np.ndarray, np.ndarray]:
    """(K, V) of a serialized block, checked against the expected shape and model fingerprint."""
    if len(data) < HEADER_BYTES:
        raise ValueError(
            f"kv block: {len(data)} bytes is shorter than the {HEADER_BYTES}-byte header"
        )
    magic, version, code, n_layers, block_size, head_dim, model, size = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ValueError(f"kv block: bad magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise ValueError(f"kv block: unsupported version {version}, expected {VERSION}")
    if code not in _DTYPES:
        raise ValueError(f"kv block: unknown dtype code {code}")
    if (n_layers, block_size, head_dim) != tuple(shape):
        raise ValueError(
            f"kv block: shape {(n_layers, block_size, head_dim)} != expected {tuple(shape)}"
        )
    if model != fingerprint:
        raise ValueError(f"kv block: model fingerprint {model:#x} != expected {fingerprint:#x}")
    dtype = _DTYPES[code]
    expected = 2 * n_layers * block_size * head_dim * dtype.itemsize
    if size != expected or len(data) - HEADER_BYTES != expected:
        raise ValueError(
            f"kv block: payload is {len(data) - HEADER_BYTES} bytes, expected {expected}"
        )
    arrays = np.frombuffer(data, dtype, offset=HEADER_BYTES).reshape(
        2, n_layers, block_size, head_dim
    )
    return arrays[0].astype(np.float32), arrays[1].astype(np.float32)
