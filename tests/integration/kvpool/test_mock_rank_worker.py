"""Mock rank workers (engine.kind mock) on a real pool service and Redis keep the real ranks'
bookkeeping on the same requests: local and pooled prefix hits, the prompt's stored blocks, the
P->D hand-off's handle (hashes, lease, tiers) and what each step is charged."""

from __future__ import annotations

import pytest

from rackserve.config import Config
from services.rank_worker import RankWorker

pytestmark = pytest.mark.integration


def worker(server, redis_url: str, kind: str, role: str, rank: int) -> RankWorker:
    cfg = Config()
    engine = cfg.engine.model_copy(update={"kind": kind, "cache_blocks_per_rank": 64})
    cfg = cfg.model_copy(update={"engine": engine})
    return RankWorker(cfg, role, f"{kind}-{role}", rank, redis_url, server.address)


def drain(w: RankWorker) -> tuple[list, dict]:
    """Step until idle: (per step: new and cached tokens, pool tokens), finished emissions."""
    steps, done = [], {}
    while True:
        step = w.step()
        if not step.batch.num_seqs:
            return steps, done
        b = step.batch
        steps.append((b.new_tokens.tolist(), b.cached_tokens.tolist(), b.pool_hbm_tokens, b.pool_dram_tokens))
        done |= {e.request_id: e for e in step.emitted if e.finish_reason}


def serve(make_pool, redis_server, kind: str) -> dict:
    """Two prefill ranks and a decode rank on one pool: a cold prompt, the same prompt on the same
    rank (local hit), on the other rank (pool hit), then the hand-off of each to the decode rank."""
    server, client = make_pool()
    p0, p1 = (worker(server, redis_server, kind, "prefill", r) for r in (0, 1))
    decode = worker(server, redis_server, kind, "decode", 0)
    prompt = [t % 200 + 1 for t in range(83)]  # 5 full blocks + 3 tokens
    longer = prompt + [t % 50 + 3 for t in range(40)]
    out: dict = {"admitted": [], "steps": [], "handles": []}
    for w, rid, p in ((p0, "cold", prompt), (p0, "local", longer), (p1, "pooled", longer)):
        out["admitted"].append(w.submit_prefill(rid, p, {"max_tokens": 4, "temperature": 0}))
        steps, done = drain(w)
        e = done[rid]
        out["steps"].append(steps)
        out["handles"].append((len(e.kv_block_hashes), e.kv_block_hashes, bool(e.kv_lease_id),
                               e.kv_block_tiers, e.reused))
        admitted = decode.submit_decode(rid, p, e.token, list(e.kv_block_hashes),
                                        {"max_tokens": 4, "temperature": 0, "ignore_eos": True},
                                        e.kv_lease_id, e.kv_block_tiers)
        steps, done = drain(decode)
        out["admitted"].append(admitted)
        out["steps"].append(steps)
        out["handles"].append(done[rid].finish_reason)
    decode.pool.client.flush_releases()
    out["leases"] = client.stats().active_leases
    return out


def test_mock_ranks_keep_prefix_hits_and_hand_off_bookkeeping(make_pool, redis_server) -> None:
    want = serve(make_pool, redis_server, "real")
    got = serve(make_pool, redis_server, "mock")
    assert got == want
    hits = [(a.local_hit_tokens, a.pool_hbm_tokens) for a in want["admitted"][::2]]
    assert hits == [(0, 0), (80, 0), (0, 112)]  # cold, local hit, pool hit (the longer prompt)
