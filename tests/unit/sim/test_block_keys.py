"""Grouped KV keys with the prompt's tail keep in-conversation hits exact."""

import random

from rackserve.routing.index import PrefixIndex
from rackserve.sim.block_keys import BlockKeys
from rackserve.sim.kv import ClusterKV, pool_limits

RANK = ("prefill-0", 0)


def _hits(group: int, convs: list[list[list[int]]]) -> int:
    kv = ClusterKV({RANK: 10**6}, pool_limits(10**12, 10**12, 0.95, 0.85), 64, 1000, PrefixIndex())
    total = 0
    for turns in zip(*convs, strict=True):  # conversations interleaved turn by turn
        for blocks in turns:
            keys = BlockKeys.of(blocks, group)
            hit, _ = kv.delivered_hit(RANK, keys, len(blocks) * 64 + 10, now=0.0)
            kv.store(RANK, keys, hit.total, now=0.0)
            total += hit.total
    return total


def test_grouped_keys_hit_exactly_what_per_block_keys_hit():
    rng = random.Random(0)
    convs = []
    for c in range(5):
        blocks, turns = [], []
        for _ in range(12):  # each turn resends the conversation plus 1..30 new blocks
            blocks = blocks + [c * 10**6 + len(blocks) + i for i in range(rng.randint(1, 30))]
            turns.append(list(blocks))
        convs.append(turns)
    exact = _hits(1, convs)
    assert exact > 0
    assert _hits(8, convs) == exact
    assert _hits(16, convs) == exact


def test_keys_name_groups_and_the_tail():
    keys = BlockKeys.of(list(range(20)), 8)
    assert keys.keys == (7, 15, 19)
    assert [keys.element_blocks(i) for i in range(3)] == [8, 8, 4]
    assert keys.refine(2, lambda span: {h for h in span if h == 17}) == 2
