"""A prefill rank (RankWorker in-process, on a real pool service and Redis) reports the prefix its
engine really started from, and is charged for every token it computes: reused + computed =
the prompt, even when its cache evicted pooled blocks between admission and the first step."""

from __future__ import annotations

import pytest

from rackserve.config import Config
from services.rank_worker import RankWorker

pytestmark = pytest.mark.integration


def worker(server, redis_url: str, cache_blocks: int, rank: int) -> RankWorker:
    cfg = Config()
    engine = cfg.engine.model_copy(update={"cache_blocks_per_rank": cache_blocks})
    cfg = cfg.model_copy(update={"engine": engine})
    return RankWorker(cfg, "prefill", "prefill-dep2-0", rank, redis_url, server.address)


def run(w: RankWorker, prompts: dict[str, list[int]]) -> dict[str, tuple]:
    """Admit every prompt, then step until all finish: (admitted, computed tokens, emitted)."""
    admitted = {rid: w.submit_prefill(rid, p, {"max_tokens": 1}) for rid, p in prompts.items()}
    computed = dict.fromkeys(prompts, 0)
    done = {}
    while len(done) < len(prompts):
        step = w.step()
        for e, new in zip(step.emitted, step.batch.new_tokens, strict=True):
            computed[e.request_id] += int(new)
            if e.finish_reason:
                done[e.request_id] = e
    return {rid: (admitted[rid], computed[rid], done[rid]) for rid in prompts}


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
