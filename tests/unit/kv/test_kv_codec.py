"""kv_codec: a block's KV round-trips bit-exactly; any mismatch is refused with ValueError."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from rackserve.kv.kv_codec import HEADER_BYTES, decode_block, encode_block

SHAPE = (4, 16, 32)
FP = 0x1234


def block():
    rng = np.random.default_rng(0)
    return rng.standard_normal(SHAPE, dtype=np.float32), rng.standard_normal(
        SHAPE, dtype=np.float32
    )


def test_roundtrip_is_exact():
    k, v = block()
    data = encode_block(k, v, FP)
    assert len(data) == HEADER_BYTES + 2 * k.nbytes
    k2, v2 = decode_block(data, SHAPE, FP)
    assert np.array_equal(k, k2) and np.array_equal(v, v2)


def patch(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: b"XXXX" + d[4:], "magic"),
        (lambda d: patch(d, 4, "<H", 2), "version"),
        (lambda d: patch(d, 6, "<B", 9), "dtype"),
        (lambda d: d[:-4], "payload"),
        (lambda d: d + b"\0\0\0\0", "payload"),
        (lambda d: d[:10], "header"),
    ],
)
def test_corrupt_data_is_refused(mutate, message):
    with pytest.raises(ValueError, match=message):
        decode_block(mutate(encode_block(*block(), FP)), SHAPE, FP)


def test_other_model_or_shape_is_refused():
    data = encode_block(*block(), FP)
    with pytest.raises(ValueError, match="fingerprint"):
        decode_block(data, SHAPE, FP + 1)
    with pytest.raises(ValueError, match="shape"):
        decode_block(data, (4, 8, 32), FP)
