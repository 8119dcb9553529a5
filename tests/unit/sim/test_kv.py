"""The simulated KV: pool writes take time on their path, and a block is found only once committed."""

import pytest

from rackserve.routing.index import PrefixIndex
from rackserve.sim.block_keys import BlockKeys
from rackserve.sim.kv import ClusterKV, pool_limits
from rackserve.sim.pool_paths import Link, PoolPaths
from rackserve.timing.capacity import PoolPath

BLOCK_TOKENS, BLOCK_BYTES = 64, 64_000
A, B = ("prefill-0", 0), ("prefill-1", 0)


def _kv(bw=1e6, hbm_blocks=1000, dram_blocks=1000):
    paths = PoolPaths({"pool_hbm": PoolPath(hbm_blocks * BLOCK_BYTES, bw, bw, 0.0),
                       "pool_dram": PoolPath(dram_blocks * BLOCK_BYTES, bw, bw, 0.0)})
    pool = pool_limits(hbm_blocks * BLOCK_BYTES, dram_blocks * BLOCK_BYTES, 0.95, 0.85)
    return ClusterKV({A: 100, B: 100}, pool, BLOCK_TOKENS, BLOCK_BYTES, PrefixIndex(), paths)


def test_a_turn_arriving_before_the_put_commits_misses_on_another_rank():
    kv = _kv(bw=1e6)  # 10 blocks of 64 kB at 1 MB/s: the put commits 0.64 s after the prefill
    hashes = list(range(1, 11))
    kv.store(A, BlockKeys.of(hashes, 1), 0, now=0.0)
    early, _ = kv.delivered_hit(B, BlockKeys.of(hashes + [99], 1), 11 * BLOCK_TOKENS, now=0.3)
    assert early.total == 0
    assert kv.recomputed_tokens["in_flight"] == 10 * BLOCK_TOKENS
    late, ready = kv.delivered_hit(B, BlockKeys.of(hashes + [99], 1), 11 * BLOCK_TOKENS, now=0.7)
    assert late.pool_hbm == 10 * BLOCK_TOKENS
    assert ready == pytest.approx(0.7 + 10 * BLOCK_BYTES / 1e6)  # the fetch takes its bytes' time too
    own, _ = kv.delivered_hit(A, BlockKeys.of(hashes + [99], 1), 11 * BLOCK_TOKENS, now=0.3)
    assert own.rank_hbm == 10 * BLOCK_TOKENS  # the writer's own HBM has them at once


def test_concurrent_transfers_share_the_link():
    link = Link(100.0)
    assert link.take(0.0, 100) == pytest.approx(1.0)
    assert link.take(0.5, 100) == pytest.approx(2.0)  # queued behind the first
    assert link.take(5.0, 100) == pytest.approx(6.0)


def test_blocks_dropped_by_a_full_pool_count_as_recomputed_from_that_tier():
    kv = _kv(bw=1e12, hbm_blocks=20, dram_blocks=20)
    for c in range(6):  # 6 chains of 10 blocks into room for ~34: the oldest are dropped
        kv.store(A, BlockKeys.of([c * 100 + i for i in range(10)], 1), 0, now=float(c))
    first = [i for i in range(10)]
    hit, _ = kv.delivered_hit(B, BlockKeys.of(first + [7777], 1), 11 * BLOCK_TOKENS, now=10.0)
    assert hit.total == 0
    assert kv.recomputed_tokens["pool_dram"] == 10 * BLOCK_TOKENS
    assert kv.evictions()["pool_dram"] > 0


def test_an_empty_prompt_finds_nothing_and_costs_nothing():
    kv = _kv()
    hit, ready = kv.delivered_hit(A, BlockKeys.of([], 1), 0, now=1.0)
    assert hit.total == 0 and ready == 1.0


@pytest.mark.parametrize("pool_blocks", [10_000, 40])
def test_evicted_rank_keys_are_looked_up_in_the_pool_only_once_it_could_lack_them(pool_blocks):
    """A key a rank evicts is unknown to its pool only after a failed put or a block leaving the pool;
    until then the lookup is skipped. Against a twin that always looks up (the same random chains
    stored and read on two ranks with small caches): the same lost keys, the same recomputed tokens."""
    import random

    def ops(kv: ClusterKV) -> None:
        rng = random.Random(7)
        convs = [[c * 1000 + i for i in range(1, 3)] for c in range(12)]
        t = 0.0
        for _ in range(300):
            t += 0.01
            conv = rng.randrange(len(convs))
            chain = convs[conv]
            chain.extend(chain[-1] + 1 + i for i in range(rng.randrange(1, 4)))
            rank = rng.choice((A, B))
            keys = BlockKeys.of(list(chain), 1)
            hit, _ = kv.delivered_hit(rank, keys, len(chain) * BLOCK_TOKENS, now=t)
            kv.store(rank, keys, hit.total, now=t)

    kv, twin = _kv(bw=1e12, hbm_blocks=pool_blocks, dram_blocks=pool_blocks), \
        _kv(bw=1e12, hbm_blocks=pool_blocks, dram_blocks=pool_blocks)
    twin._put_failed = [True]  # always looks the evicted keys up
    calls = {"kv": 0, "twin": 0}
    for name, k in (("kv", kv), ("twin", twin)):
        lookup = k.pool.unknown

        def counted(hashes, _name=name, _lookup=lookup):
            calls[_name] += 1
            return _lookup(hashes)

        k.pool.unknown = counted
        ops(k)
    assert kv.evictions()["rank_hbm"] > 0 and calls["twin"] > 0
    assert kv._lost == twin._lost and kv.recomputed_tokens == twin.recomputed_tokens
    if pool_blocks == 10_000:  # nothing ever left the pool: no lookup was needed
        assert kv.pool.forgotten == 0 and calls["kv"] == 0
    else:  # the pool dropped blocks: evicted keys were looked up from then on, and some were lost
        assert kv.pool.forgotten > 0 and calls["kv"] > 0 and "rank_hbm" in kv._lost.values()


def test_visibility_equals_a_per_key_table_of_each_keys_last_write():
    """The event lag's writes kept as key sets (ShortVisibility), and the per-key table, give what a
    table of each key's last write time gives (bisected the same way): chains growing at later times, a chain's tail written again (a
    rank storing keys it had evicted), read at random times."""
    import random

    from rackserve.sim.kv import ShortVisibility, Visibility, visibility

    def table_visible(last: dict[int, float], chain: list[int], n: int, now: float) -> int:
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) // 2
            if last.get(chain[mid], 0.0) > now:
                hi = mid
            else:
                lo = mid + 1
        return lo

    rng = random.Random(5)
    hidden_seen = 0
    assert isinstance(visibility(5e-4), ShortVisibility) and not isinstance(visibility(0.02), ShortVisibility)
    for lag, kind in ((5e-4, ShortVisibility), (5e-4, Visibility), (0.02, ShortVisibility), (0.02, Visibility),
                      (1.0, ShortVisibility), (1.0, Visibility)):
        vis, last = kind(lag), {}
        now, chains = 0.0, [[] for _ in range(6)]
        for _ in range(400):
            now += rng.expovariate(200.0)
            chain = chains[rng.randrange(6)]
            if rng.random() < 0.6:
                if chain and rng.random() < 0.3:
                    new = chain[-rng.randint(1, len(chain)):]  # its tail again
                else:
                    new = [rng.getrandbits(40) for _ in range(rng.randint(1, 5))]
                    chain += new
                vis.add(new, now)
                last.update(dict.fromkeys(new, now + lag))
            if chain:
                n = rng.randint(0, len(chain))
                got = vis.visible(chain, n, now)
                assert got == table_visible(last, chain, n, now)
                hidden_seen += got < n
    assert hidden_seen > 50  # the lag did hide keys
