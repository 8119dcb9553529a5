"""Engram: row ids are a pure, causal function of token ids; table rows are range-independent."""

from __future__ import annotations

import numpy as np

from rackserve.model.config import ModelConfig
from rackserve.model.engram import (
    EngramTable,
    LocalEngramTable,
    engram_row_ids,
    engram_row_ids_span,
    engram_row_ids_windows,
    engram_windows,
    hash_seed,
)

CFG = ModelConfig(engram_rows=5000)


def tokens(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, CFG.vocab_size, n)


def test_row_ids_shape_range_and_determinism():
    ids = engram_row_ids(tokens(50), CFG)
    assert ids.shape == (50, CFG.engram_heads) and ids.dtype == np.int64
    assert ids.min() >= 0 and ids.max() < CFG.engram_rows
    assert np.array_equal(ids, engram_row_ids(tokens(50).tolist(), CFG))


def test_position_uses_only_tokens_up_to_it():
    base = tokens(40)
    changed = base.copy()
    changed[20] = (changed[20] + 1) % CFG.vocab_size
    a, b = engram_row_ids(base, CFG), engram_row_ids(changed, CFG)
    longest = max(CFG.engram_ngrams)
    assert np.array_equal(a[:20], b[:20])
    assert np.array_equal(a[20 + longest :], b[20 + longest :])
    # Position 20 changes in every head; position 21 only in n-grams that still reach token 20.
    assert np.all(a[20] != b[20])
    bigram_heads = slice(0, CFG.engram_heads_per_ngram)
    assert np.array_equal(a[22, bigram_heads], b[22, bigram_heads])


def test_same_ngram_same_rows_anywhere():
    seq = np.array([5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8])
    ids = engram_row_ids(seq, CFG)
    assert np.array_equal(ids[3], ids[11])  # same 4-gram ending there


def test_span_matches_full_sequence():
    seq = tokens(100, seed=2)
    full = engram_row_ids(seq, CFG)
    for start, stop in [(0, 5), (1, 2), (37, 90), (99, 100)]:
        assert np.array_equal(engram_row_ids_span(seq, start, stop, CFG), full[start:stop])


def test_hash_heads_have_distinct_seeds():
    seeds = {hash_seed(n, h) for n in CFG.engram_ngrams for h in range(CFG.engram_heads_per_ngram)}
    assert len(seeds) == CFG.engram_heads


def test_rows_are_identical_for_any_range():
    table = LocalEngramTable(CFG, seed=3)
    assert isinstance(table, EngramTable)
    whole = table.rows(1, 0, CFG.engram_rows)
    assert whole.shape == (CFG.engram_rows, CFG.engram_dim) and whole.dtype == np.float32
    for start, stop in [(0, 1), (4090, 4100), (1234, 4999)]:
        assert np.array_equal(LocalEngramTable(CFG, seed=3).rows(1, start, stop), whole[start:stop])
    assert not np.array_equal(table.rows(0, 0, 10), whole[:10])


def test_lookup_shape():
    table = LocalEngramTable(CFG)
    ids = engram_row_ids(tokens(7), CFG)
    rows = table.lookup(0, ids)
    assert rows.shape == (7, CFG.engram_heads, CFG.engram_dim)
    assert np.array_equal(rows[2, 1], table.rows(0, ids[2, 1], ids[2, 1] + 1)[0])


def test_windows_of_several_sequences_hash_in_one_call():
    a, b = tokens(30, seed=4), tokens(9, seed=5)
    windows = np.concatenate(
        [engram_windows(a, 28, 30, CFG), engram_windows(b, 0, 9, CFG), engram_windows(a, 3, 4, CFG)]
    )
    rows = engram_row_ids_windows(windows, CFG)
    full_a, full_b = engram_row_ids(a, CFG), engram_row_ids(b, CFG)
    assert np.array_equal(rows, np.concatenate([full_a[28:30], full_b, full_a[3:4]]))
    assert engram_windows(a, 5, 5, CFG).shape == (0, max(CFG.engram_ngrams))
