"""PrefixClosure: the orphan count equals a brute-force count under any adds and removes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rackserve.routing.closure import UNKNOWN_PARENT, PrefixClosure

# A small forest: block b's parent is PARENT[b] (None = a chain root); 7 has an unknown parent.
PARENT = {0: None, 1: 0, 2: 1, 3: 2, 4: 1, 5: 4, 6: None, 7: UNKNOWN_PARENT}


def _brute(members: set[int]) -> int:
    return sum(1 for b in members if PARENT[b] is not None and PARENT[b] not in members)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from(sorted(PARENT))), max_size=40))
def test_orphans_match_brute_force(ops):
    members: set[int] = set()
    closure = PrefixClosure()
    for add, block in ops:
        if add and block not in members:
            members.add(block)
            closure.added(block, PARENT[block], members.__contains__)
        elif not add and block in members:
            members.discard(block)
            closure.removed(block, PARENT[block], members.__contains__)
        assert closure.orphans == _brute(members)
    assert (closure.orphans == 0) == all(PARENT[b] is None or PARENT[b] in members for b in members)


def test_returned_deltas_sum_to_the_count():
    members: set[int] = set()
    closure, total = PrefixClosure(), 0
    for block in (3, 2, 1, 0, 7):
        members.add(block)
        total += closure.added(block, PARENT[block], members.__contains__)
    assert total == closure.orphans == 1  # only 7 (unknown parent)
    members.discard(1)
    total += closure.removed(1, PARENT[1], members.__contains__)
    assert total == closure.orphans == 2  # 2 lost its parent


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.sets(st.sampled_from(sorted(PARENT)), max_size=5)), max_size=25
    )
)
def test_batches_in_any_order_match_brute_force(ops):
    members: set[int] = set()
    closure = PrefixClosure()
    for add, batch in ops:
        batch = sorted(batch - members if add else batch & members, reverse=True)  # children first
        if add:
            members.update(batch)
            closure.added_many(batch, [PARENT[b] for b in batch], members.__contains__)
        else:
            members.difference_update(batch)
            closure.removed_many(batch, [PARENT[b] for b in batch], members.__contains__)
        assert closure.orphans == _brute(members)
