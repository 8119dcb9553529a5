"""The Engram row cache: a cached row is the row put, a slot holds one id, and among ids that
share a slot in one put the last one stays."""

from __future__ import annotations

import numpy as np

from services.engram.row_cache import RowCache


def rows_of(ids: np.ndarray) -> np.ndarray:
    return np.repeat(ids[:, None].astype(np.float32), 4, axis=1)


def test_put_then_get_returns_the_rows_put() -> None:
    cache = RowCache(8, 4)
    ids = np.array([1, 2, 3], dtype=np.int64)
    assert not cache.hits(ids).any()
    cache.put(ids, rows_of(ids))
    assert cache.hits(ids).all()
    assert np.array_equal(cache.get(ids), rows_of(ids))


def test_a_newer_id_takes_its_slot() -> None:
    cache = RowCache(8, 4)
    cache.put(np.array([3]), rows_of(np.array([3])))
    cache.put(np.array([11]), rows_of(np.array([11])))  # 11 mod 8 = 3
    assert cache.hits(np.array([3, 11])).tolist() == [False, True]
    assert np.array_equal(cache.get(np.array([11])), rows_of(np.array([11])))


def test_ids_sharing_a_slot_in_one_put_keep_the_last() -> None:
    cache = RowCache(8, 4)
    ids = np.array([3, 11, 19], dtype=np.int64)
    cache.put(ids, rows_of(ids))
    assert cache.hits(ids).tolist() == [False, False, True]
    assert np.array_equal(cache.get(np.array([19])), rows_of(np.array([19])))
