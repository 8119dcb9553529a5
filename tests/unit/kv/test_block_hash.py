"""Properties of the chained block hashes (rackserve/kv/block_hash.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rackserve.kv.block_hash import block_hashes, hash_block, root_hash

BS = 4
tokens_st = st.lists(st.integers(0, 263), min_size=BS, max_size=8 * BS)


@given(tokens_st, tokens_st)
def test_equal_prefixes_give_equal_ids(a, b):
    ha, hb = block_hashes(a, BS, "m"), block_hashes(a + b, BS, "m")
    assert hb[: len(ha)] == ha


@given(tokens_st, st.data())
def test_changed_token_changes_its_block_and_every_later_one(tokens, data):
    i = data.draw(st.integers(0, len(tokens) - 1))
    changed = list(tokens)
    changed[i] = (changed[i] + 1) % 264
    h1, h2 = block_hashes(tokens, BS, "m"), block_hashes(changed, BS, "m")
    first = i // BS
    assert h1[:first] == h2[:first]
    assert all(x != y for x, y in zip(h1[first:], h2[first:], strict=True))


def test_hash_depends_on_parent_and_model():
    block = [1, 2, 3, 4]
    assert hash_block(1, block) != hash_block(2, block)
    assert block_hashes(block * 2, BS, "m")[1] == hash_block(
        hash_block(root_hash("m"), block), block
    )
    assert block_hashes(block, BS, "m") != block_hashes(block, BS, "other")


def test_partial_block_is_not_hashed():
    assert len(block_hashes(list(range(2 * BS + 3)), BS, "m")) == 2
