"""The closed-form per-rank sums agree with a position-by-position reference."""

from __future__ import annotations

import numpy as np

from rackserve.timing.batch_features import CodeShape, group_sums


def _reference(queries, end, window, code: CodeShape):
    win = comp = scan = 0.0
    for q, e in zip(queries, end, strict=False):
        for p in range(e - q + 1, e + 1):
            win += min(p, window)
            if code.ratio == 0:
                continue
            if code.indexer:
                comp += min(p / code.ratio, code.top_k)
                scan += p / code.ratio
            else:
                comp += p / code.ratio
    return win, comp, scan


def test_group_sums_match_reference():
    rng = np.random.default_rng(0)
    codes = (
        CodeShape(0, False, 512),
        CodeShape(4, True, 512),
        CodeShape(128, False, 512),
        CodeShape(1, False, 0),
    )
    for _ in range(20):
        n = int(rng.integers(1, 6))
        queries = rng.integers(1, 700, n)
        end = queries + rng.integers(0, 5000, n)
        got = group_sums(queries, end, 128, codes)
        assert got.tokens == queries.sum()
        for i, code in enumerate(codes):
            win, comp, scan = _reference(queries.tolist(), end.tolist(), 128, code)
            assert np.isclose(got.window_entries, win)
            assert np.isclose(got.comp_entries[i], comp)
            assert np.isclose(got.scan_entries[i], scan)


def test_vectorized_decode_sums_equal_rank_by_rank_sums():
    from rackserve.timing.batch import RankBatch
    from rackserve.timing.batch_features import (
        GroupArrays,
        _decode_arrays,
        code_shapes,
        rank_groups,
    )
    from rackserve.timing.spec import load_model

    model = load_model("deepseek-v4.1-flash")
    codes = code_shapes(model)
    rng = np.random.default_rng(1)
    for _ in range(10):
        ranks = []
        for _r in range(int(rng.integers(1, 9))):
            n = int(rng.integers(0, 40))  # idle ranks included
            ranks.append(RankBatch.of([1] * n, rng.integers(0, 200_000, n).tolist()))
        if sum(rb.num_seqs for rb in ranks) == 0:
            continue
        fast = _decode_arrays(ranks, model.attention.window, codes)
        slow = GroupArrays.stack([rank_groups(rb, "decode", model, codes)[0] for rb in ranks])
        for field in (
            "tokens",
            "seqs",
            "window_entries",
            "comp_entries",
            "scan_entries",
            "key_reads",
        ):
            np.testing.assert_allclose(
                getattr(fast, field), getattr(slow, field), rtol=1e-12, err_msg=field
            )
    assert (
        _decode_arrays([RankBatch.of([2], [5])], model.attention.window, codes) is None
    )  # multi-token: general path
