"""PagedKV: slots address (block, offset); gather returns blocks in table order."""

from __future__ import annotations

import numpy as np

from rackserve.kv.paged_kv import PagedKV


def test_write_then_gather_in_table_order():
    kv = PagedKV(n_layers=2, num_blocks=4, block_size=2, head_dim=3)
    k = np.arange(12, dtype=np.float32).reshape(4, 3)
    slots = np.array([3 * 2 + 0, 3 * 2 + 1, 1 * 2 + 0, 1 * 2 + 1])  # block 3 then block 1
    kv.write(1, slots, k, -k)
    keys, values = kv.gather(1, np.array([3, 1]))
    assert np.array_equal(keys, k) and np.array_equal(values, -k)
    assert not kv.k[0].any()  # other layers untouched


def test_block_roundtrip_copies():
    kv = PagedKV(n_layers=2, num_blocks=3, block_size=2, head_dim=3)
    k = np.random.default_rng(0).standard_normal((2, 2, 3), dtype=np.float32)
    kv.write_block(2, k, k + 1)
    got_k, got_v = kv.read_block(2)
    assert np.array_equal(got_k, k) and np.array_equal(got_v, k + 1)
    got_k[:] = 0  # a copy: the cache is not changed through it
    assert np.array_equal(kv.read_block(2)[0], k)
