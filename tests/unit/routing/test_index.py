"""PrefixIndex: events in -> matches out, gaps -> stale -> resync, replay -> identical index."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from rackserve.kv.block_cache import BlockCache
from rackserve.kv.block_hash import block_hashes
from rackserve.kv.events import EventSequencer, KVEvent, Publisher
from rackserve.kv.pool_tiers import BlockPut, PoolLimits, PoolTiers
from rackserve.routing import PrefixHit, PrefixIndex

BS = 16
TOKENS = list(range(1000, 1000 + 10 * BS + 5))  # 10 full blocks + 5 tokens
CHAIN = block_hashes(TOKENS, BS, "m")
A, B, C = Publisher("p0", 0), Publisher("p0", 1), Publisher("p1", 0)
POOL = Publisher("pool", 0)


def _loaded() -> tuple[PrefixIndex, dict[Publisher, EventSequencer]]:
    idx = PrefixIndex()
    seqs = {p: EventSequencer(p) for p in (A, B, C, POOL)}
    idx.apply(seqs[A].make("stored", "rank_hbm", tuple(CHAIN[:4])))
    idx.apply(seqs[B].make("stored", "rank_hbm", tuple(CHAIN[:2])))
    idx.apply(seqs[POOL].make("stored", "pool_hbm", tuple(CHAIN[:6])))
    idx.apply(seqs[POOL].make("stored", "pool_dram", tuple(CHAIN[5:8]), CHAIN[4]))
    return idx, seqs


def _hit(
    idx: PrefixIndex, pub: Publisher, chain: list[int] = CHAIN, prompt: int = len(TOKENS)
) -> PrefixHit:
    return idx.match(chain, BS, prompt).hit((pub.instance, pub.dp_rank))


def test_stored_events_give_hbm_then_pool_prefix_by_tier():
    idx, _ = _loaded()
    # A: 4 blocks in HBM, then pool blocks 4,5 (spare HBM) and 6,7 (DRAM only), block 8 nowhere.
    assert _hit(idx, A) == PrefixHit(4 * BS, 2 * BS, 2 * BS)
    assert _hit(idx, B) == PrefixHit(2 * BS, 4 * BS, 2 * BS)
    assert _hit(idx, C) == PrefixHit(0, 6 * BS, 2 * BS)
    assert idx.match(CHAIN, BS, len(TOKENS)).rank_blocks == {("p0", 0): 4, ("p0", 1): 2}


def test_removed_and_non_contiguous_blocks_stop_the_prefix():
    idx, seqs = _loaded()
    idx.apply(seqs[A].make("removed", "rank_hbm", (CHAIN[2],)))
    idx.apply(seqs[POOL].make("removed", "pool_hbm", (CHAIN[3],)))
    # A holds 0,1,3: its HBM prefix is 2 blocks; the pool run from block 2 stops at block 3.
    assert _hit(idx, A) == PrefixHit(2 * BS, 1 * BS, 0)
    # C has no HBM blocks: the pool prefix from block 0 is blocks 0..2.
    assert _hit(idx, C) == PrefixHit(0, 3 * BS, 0)


def test_unknown_request_and_empty_index_match_nothing():
    idx, _ = _loaded()
    other = block_hashes(TOKENS, BS, "another-model")
    assert _hit(idx, A, other) == PrefixHit()
    assert PrefixIndex().match(CHAIN, BS, len(TOKENS)).rank_blocks == {}


def test_hit_is_capped_one_token_below_the_prompt():
    idx, seqs = _loaded()
    prompt = TOKENS[: 4 * BS]  # exactly the 4 blocks A holds
    assert _hit(idx, A, block_hashes(prompt, BS, "m"), len(prompt)) == PrefixHit(4 * BS - 1, 0, 0)
    idx.apply(seqs[C].make("stored", "rank_hbm", tuple(CHAIN[:1])))
    # C: 1 block in HBM, pool from block 1: blocks 1..3 in pool HBM, capped at 63 tokens in all.
    assert _hit(idx, C, CHAIN[:4], 4 * BS) == PrefixHit(BS, 3 * BS - 1, 0)


def test_duplicate_events_are_ignored():
    idx, seqs = _loaded()
    ev = seqs[C].make("stored", "rank_hbm", tuple(CHAIN[:3]))
    assert idx.apply(ev) is True
    idx.apply(seqs[C].make("removed", "rank_hbm", tuple(CHAIN[:3])))
    assert idx.apply(ev) is False  # replayed stale copy must not resurrect the blocks
    assert _hit(idx, C).rank_hbm == 0


def test_gap_marks_publisher_stale_until_cleared():
    idx, seqs = _loaded()
    seqs[A].make("stored", "rank_hbm", tuple(CHAIN[4:6]), CHAIN[3])  # seq 2 lost in transit
    idx.apply(seqs[A].make("stored", "rank_hbm", tuple(CHAIN[6:7]), CHAIN[5]))  # seq 3: gap
    assert idx.is_stale(A) and not idx.is_stale(B)
    assert idx.stale_publishers() == frozenset({A})
    assert _hit(idx, A).rank_hbm == 0  # A's entries are not trusted
    assert _hit(idx, B).rank_hbm == 2 * BS
    idx.apply(seqs[A].make("cleared", "rank_hbm"))
    assert not idx.is_stale(A)
    assert idx.blocks(A, "rank_hbm") == frozenset()
    idx.apply(seqs[A].make("stored", "rank_hbm", tuple(CHAIN[:3])))
    assert _hit(idx, A).rank_hbm == 3 * BS


def test_gap_then_resync_from_snapshot():
    idx, seqs = _loaded()
    for _ in range(3):
        seqs[A].make("stored", "rank_hbm", (123,))  # seqs 2..4 lost
    idx.apply(seqs[A].make("stored", "rank_hbm", (456,)))  # seq 5
    assert idx.is_stale(A)
    idx.resync(A, "rank_hbm", CHAIN[:5], seq=5)
    assert not idx.is_stale(A) and idx.last_seq(A) == 5
    assert _hit(idx, A).rank_hbm == 5 * BS
    idx.apply(seqs[A].make("removed", "rank_hbm", (CHAIN[4],)))  # seq 6 follows on
    assert not idx.is_stale(A) and _hit(idx, A).rank_hbm == 4 * BS


def test_stale_pool_publisher_gives_no_pool_hits():
    idx, seqs = _loaded()
    seqs[POOL].make("stored", "pool_hbm", (1,))  # lost
    idx.apply(seqs[POOL].make("stored", "pool_dram", (2,)))
    assert idx.is_stale(POOL)
    assert _hit(idx, C) == PrefixHit()
    assert _hit(idx, A) == PrefixHit(4 * BS, 0, 0)
    idx.resync(POOL, "pool_hbm", CHAIN[:3], seq=idx.last_seq(POOL))
    assert idx.is_stale(POOL)  # pool_dram is still untrusted
    assert _hit(idx, C) == PrefixHit(0, 3 * BS, 0)
    idx.apply(seqs[POOL].make("cleared", "pool_dram"))
    assert not idx.is_stale(POOL)


def test_first_event_not_numbered_one_is_a_gap():
    idx = PrefixIndex()
    idx.apply(KVEvent("stored", C, 7, "rank_hbm", tuple(CHAIN[:2])))
    assert idx.is_stale(C)


CHAIN2 = CHAIN[:4] + block_hashes(TOKENS[4 * BS :][::-1], BS, "m", parent=CHAIN[3])  # a branch


def _stored(seq: EventSequencer, tier: str, chain: list[int], lo: int, hi: int) -> KVEvent:
    return seq.make("stored", tier, tuple(chain[lo:hi]), chain[lo - 1] if lo else None)


def _stream(seed: int, n: int) -> list[KVEvent]:
    """Any stores and removes of chain slices (holes included), parents per the event contract."""
    rng = random.Random(seed)
    pubs = {p: EventSequencer(p) for p in (A, B, C, POOL)}
    out = []
    for _ in range(n):
        pub = rng.choice(list(pubs))
        tier = rng.choice(["pool_hbm", "pool_dram"]) if pub is POOL else "rank_hbm"
        kind = rng.choices(["stored", "removed", "cleared"], [6, 3, 1])[0]
        chain = rng.choice([CHAIN, CHAIN2])
        lo = rng.randrange(len(chain))
        hi = rng.randrange(lo, len(chain)) + 1
        if kind == "stored":
            out.append(_stored(pubs[pub], tier, chain, lo, hi))
        else:
            out.append(pubs[pub].make(kind, tier, () if kind == "cleared" else tuple(chain[lo:hi])))
    return out


def test_replaying_the_stream_rebuilds_the_identical_index():
    events = _stream(1, 300)
    first, second = PrefixIndex(), PrefixIndex()
    first.apply_all(events)
    assert second.apply_all(events[:150]) == 150
    assert second.apply_all(events) == 150  # a restarted consumer re-reads from the start
    assert first.snapshot() == second.snapshot()
    assert len(first) == len(second) > 0
    for pub in (A, B, C):
        assert _hit(first, pub) == _hit(second, pub)


def _reference_hit(
    events: list[KVEvent], pub: Publisher, chain: list[int], prompt: int
) -> PrefixHit:
    """Naive model: replay into per-(publisher, tier) sets, walk the chain block by block."""
    held: dict[tuple[Publisher, str], set[int]] = {}
    for e in events:
        s = held.setdefault((e.publisher, e.tier), set())
        if e.kind == "stored":
            s.update(e.block_hashes)
        elif e.kind == "removed":
            s.difference_update(e.block_hashes)
        else:
            s.clear()
    mine = held.get((pub, "rank_hbm"), set())
    phbm, pdram = held.get((POOL, "pool_hbm"), set()), held.get((POOL, "pool_dram"), set())
    i, tiers = 0, []
    while i < len(chain) and chain[i] in mine:
        tiers.append("h")
        i += 1
    while i < len(chain) and (chain[i] in phbm or chain[i] in pdram):
        tiers.append("p" if chain[i] in phbm else "d")
        i += 1
    room = prompt - 1
    h = min(tiers.count("h") * BS, room)
    p = min(tiers.count("p") * BS, room - h)
    return PrefixHit(h, p, min(tiers.count("d") * BS, room - h - p))


def _check(idx: PrefixIndex, events: list[KVEvent], prompt_blocks: int) -> None:
    prompt = prompt_blocks * BS + 3
    for chain in (CHAIN, CHAIN2):
        for pub in (A, B, C):
            want = _reference_hit(events, pub, chain[:prompt_blocks], prompt)
            assert _hit(idx, pub, chain[:prompt_blocks], prompt) == want
            key = (pub.instance, pub.dp_rank)
            assert idx.match(chain[:prompt_blocks], BS, prompt, exact_walk=True).hit(key) == want


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 80), prompt_blocks=st.integers(1, 10))
def test_matches_agree_with_a_naive_walk(seed: int, n: int, prompt_blocks: int):
    events = _stream(seed, n)
    idx = PrefixIndex()
    idx.apply_all(events)
    _check(idx, events, prompt_blocks)


def test_a_hole_or_an_unknown_parent_leaves_the_search_path():
    idx, seqs = _loaded()
    assert idx.prefix_closed
    idx.apply(seqs[A].make("removed", "rank_hbm", (CHAIN[1],)))
    assert not idx.prefix_closed  # A holds 0, 2, 3
    idx.apply(seqs[A].make("stored", "rank_hbm", (CHAIN[1],), CHAIN[0]))
    assert idx.prefix_closed
    idx.resync(C, "rank_hbm", [CHAIN[0], CHAIN2[5]], seq=0)  # CHAIN2[5]: parent never seen
    assert not idx.prefix_closed
    idx.resync(C, "rank_hbm", CHAIN2[:6], seq=0, parent_hashes=[None, *CHAIN2[:5]])
    assert idx.prefix_closed
    assert _hit(idx, C, CHAIN2) == PrefixHit(6 * BS, 0, 0)


def test_an_unknown_parent_is_learned_when_an_event_names_it():
    """A snapshot without parents marks its blocks' parents unknown (the exact walk); once any
    holder's stored event names those parents, the index is prefix-closed again (it used to keep
    the unknown parent, and the slow path, for as long as the block was held)."""
    idx, seqs = _loaded()
    idx.resync(C, "rank_hbm", CHAIN2[:6], seq=0)  # parents unknown
    assert not idx.prefix_closed
    idx.apply(seqs[B].make("stored", "rank_hbm", tuple(CHAIN2[2:6]), CHAIN2[1]))
    assert idx.prefix_closed
    assert _hit(idx, C, CHAIN2) == PrefixHit(6 * BS, 0, 0)
    assert _hit(idx, B, CHAIN2) == PrefixHit(6 * BS, 0, 0)


def _real_eviction_stream(seed: int, n: int) -> list[KVEvent]:
    """Events as the real caches publish them: random puts and lookups of chain prefixes on a
    small PoolTiers (demotions to DRAM, drops), random requests on three small BlockCaches (ranks
    A, B, C); their eviction order is whatever the code does (rackserve/kv), not a model of it."""
    rng = random.Random(seed)
    pool = PoolTiers(PoolLimits(4 * 100, 3 * 100, 10**6, 0.9, 0.5, 2.0), publisher=POOL)
    caches = [BlockCache(5, BS, publisher=p) for p in (A, B, C)]
    out: list[KVEvent] = []
    for t in range(n):
        chain = rng.choice([CHAIN, CHAIN2])[: rng.randrange(1, 9)]
        cache = rng.choice(caches)
        if rng.random() < 0.4:
            if rng.random() < 0.6:
                pool.store([BlockPut(h, 100) for h in chain], "w", float(t))
            else:
                pool.lookup(chain[rng.randrange(len(chain)) :], float(t), lease=rng.random() < 0.3)
            out += pool.drain()[0]
            continue
        tokens = [[h % 1000] * BS for h in chain]  # any tokens, the same for a hash
        hit = cache.match_prefix(chain, tokens)
        cache.acquire(hit)
        need = len(chain) - len(hit)
        if need <= cache.num_free:
            blocks = hit + cache.allocate(need)
            for i in range(len(hit), len(chain)):
                cache.commit(blocks[i], chain[i], tokens[i], chain[i - 1] if i else None)
            cache.release(blocks)
        else:
            cache.release(hit)
        out += cache.drain_events()
    return out


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 80), prompt_blocks=st.integers(1, 10))
def test_streams_of_the_real_caches_are_prefix_closed_and_agree(seed, n, prompt_blocks):
    events = _real_eviction_stream(seed, n)
    idx = PrefixIndex()
    idx.apply_all(events)
    assert idx.prefix_closed  # the caches' eviction keeps the search path exact
    _check(idx, events, prompt_blocks)
