"""Rank workers in-process on a real pool service and Redis: a prefill rank reports the prefix its
engine really started from and is charged for every token it computes (reused + computed = the
prompt, even when its cache evicted pooled blocks between admission and the first step); the P->D
hand-off is leased against eviction, and a decode rank is charged what its engine computes."""

from __future__ import annotations

import numpy as np
import pytest

from rackserve.config import Config
from rackserve.kv.pool_tiers import PoolLimits
from services.kvpool.client import PoolClient
from services.rank_worker import RankWorker

pytestmark = pytest.mark.integration


def worker(server, redis_url: str, cache_blocks: int, rank: int, role: str = "prefill") -> RankWorker:
    cfg = Config()
    engine = cfg.engine.model_copy(update={"cache_blocks_per_rank": cache_blocks})
    cfg = cfg.model_copy(update={"engine": engine})
    return RankWorker(cfg, role, f"{role}-0", rank, redis_url, server.address)


def run(w: RankWorker, prompts: dict[str, list[int]], max_tokens: int = 1) -> dict[str, tuple]:
    """Admit every prompt (the request asks for `max_tokens`; more than 1: a decode rank follows),
    then step until all finish: (admitted, computed tokens, emitted)."""
    admitted = {rid: w.submit_prefill(rid, p, {"max_tokens": max_tokens}) for rid, p in prompts.items()}
    computed = dict.fromkeys(prompts, 0)
    done = {}
    while len(done) < len(prompts):
        step = w.step()
        for e, new in zip(step.emitted, step.batch.new_tokens, strict=True):
            computed[e.request_id] += int(new)
            if e.finish_reason:
                done[e.request_id] = e
    return {rid: (admitted[rid], computed[rid], done[rid]) for rid in prompts}


BLOCK_BYTES = 16 * 1024 + 32  # one small-model block in kv_codec format (16 tokens x 1 KiB + header)
POOL_BLOCKS = 8


def pressure(server, seed: int) -> None:
    """Another writer fills the pool's one tier twice over: every unleased older block goes."""
    rng = np.random.default_rng(seed)
    with PoolClient(server.address, owner="pressure") as other:
        for _ in range(2 * POOL_BLOCKS):
            assert other.put([int(rng.integers(1, 2**63))], [rng.bytes(BLOCK_BYTES)]).ok


def test_the_hand_off_is_leased_and_the_decode_rank_is_charged_what_it_computes(
    make_pool, redis_server
) -> None:
    """Prefill stores 5 full blocks and hands them off; another writer's puts evict everything
    unleased before the decode rank fetches. The decode rank still gets all 5 blocks (leased from
    the prefill's commit to its read; on the old code they were gone and it recomputed them), and
    its first step is charged exactly what its engine computed: the partial last block (3 tokens)
    plus the first token (the old code charged 1)."""
    prompt = [t % 200 + 1 for t in range(83)]  # 5 full blocks + 3 tokens
    server, client = make_pool(PoolLimits(POOL_BLOCKS * BLOCK_BYTES, 0, 1 << 40, 0.9, 0.5, 30.0))
    ((_, _, emitted),) = run(worker(server, redis_server, 64, 0), {"p": prompt}, max_tokens=3).values()
    assert len(emitted.kv_block_hashes) == 5 and emitted.kv_lease_id
    pressure(server, seed=1)
    decode = worker(server, redis_server, 64, 0, role="decode")
    admitted = decode.submit_decode("d", prompt, emitted.token, list(emitted.kv_block_hashes),
                                    {"max_tokens": 3}, emitted.kv_lease_id)
    assert admitted.pool_hbm_tokens == 5 * 16
    step = decode.step()
    assert int(step.batch.new_tokens[0]) == 3 + 1  # charged = computed: the tail and the first token
    assert int(step.batch.cached_tokens[0]) == 5 * 16
    decode.pool.client.flush_releases()
    assert client.stats().active_leases == 0
    pressure(server, seed=2)
    assert client.match_prefix(list(emitted.kv_block_hashes)).count == 0  # released: evictable


def reused(e) -> int:
    return e.reused.local_hit_tokens + e.reused.pool_hbm_tokens + e.reused.pool_dram_tokens


def test_reported_hits_are_what_the_engine_started_from(make_pool, redis_server) -> None:
    first = [t % 200 + 1 for t in range(83)]  # 5 full blocks + 3 tokens
    second = [t % 190 + 7 for t in range(83)]
    server, _ = make_pool()
    run(worker(server, redis_server, 64, 0), {"w1": first, "w2": second})  # both now in the pool
    reader = worker(server, redis_server, 6, 1)
    # both fetched from the pool at admission; importing the second evicts the first's blocks
    out = run(reader, {"a": first, "b": second})
    for rid, prompt in (("a", first), ("b", second)):
        admitted, computed, emitted = out[rid]
        assert admitted.pool_hbm_tokens + admitted.pool_dram_tokens == 5 * 16  # found at admission
        assert reused(emitted) + computed == len(prompt), (rid, emitted.reused, computed)
    assert reused(out["a"][2]) < 5 * 16  # the engine did lose some of what admission found



def test_ready_is_false_when_the_cache_leaked_blocks(make_pool, redis_server) -> None:
    """`ready` (the health probe's question) used to answer True whatever the rank's state."""
    server, _ = make_pool()
    w = worker(server, redis_server, 16, 0)
    assert w.ready()
    run(w, {"a": [t % 200 + 1 for t in range(40)]})
    assert w.ready()  # the finished request gave its blocks back (cached ones stay evictable)
    w.engine.cache.acquire([0])  # a block referenced by no request: leaked
    assert not w.ready()
