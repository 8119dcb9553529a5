"""Each policy on crafted cluster states picks the rank it should; the registry rejects bad names."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rackserve.config import RoutingSection, load_config
from rackserve.kv.block_hash import block_hashes
from rackserve.kv.events import EventSequencer, Publisher
from rackserve.routing import (
    ClusterView,
    PolicySettings,
    PrefixHit,
    RankState,
    RequestView,
    Router,
    make_policy,
    policy_names,
)

BS = 16
TOKENS = list(range(500, 500 + 10 * BS + 5))  # 165 tokens: 10 full blocks
REQ = RequestView(tuple(block_hashes(TOKENS, BS, "m")), len(TOKENS), BS, "r1")


def _router(name: str, cost=None, **kw) -> Router:
    return Router(make_policy(name, PolicySettings(cost=cost, **kw)))


def _cache(router: Router, instance: str, dp_rank: int, blocks: int) -> None:
    seq = EventSequencer(Publisher(instance, dp_rank))
    router.index.apply(seq.make("stored", "rank_hbm", REQ.block_hashes[:blocks]))


def _with(cluster: ClusterView, key: tuple[str, int], **changes) -> ClusterView:
    return ClusterView(
        tuple(dataclasses.replace(r, **changes) if r.key == key else r for r in cluster.ranks)
    )


def test_registry_names_and_bad_name():
    assert set(policy_names()) == {
        "least-uncached-work",
        "dynamo-kv",
        "round-robin",
        "random",
        "least-loaded",
        "prefix-hash",
    }
    with pytest.raises(ValueError, match="no-such-policy"):
        make_policy("no-such-policy")
    with pytest.raises(ValueError, match="least-uncached-work needs a cost model"):
        make_policy("least-uncached-work")
    with pytest.raises(ValueError, match="no-such-policy"):
        Router.from_config(RoutingSection(policy="no-such-policy"))
    with pytest.raises(ValueError, match=r"routing.*unknown policy 'nope'"):
        load_config(environ={"RACKSERVE_ROUTING__POLICY": "nope"})


def test_config_knobs_reach_the_policy(idle_cluster):
    section = load_config(
        environ={"RACKSERVE_ROUTING__POLICY": "dynamo-kv", "RACKSERVE_ROUTING__TEMPERATURE": "5"}
    ).routing
    r = Router.from_config(section)
    _cache(r, "p1", 0, 8)
    picks = Counter(r.route(REQ, idle_cluster).key for _ in range(400))
    assert len(picks) == 4  # hot temperature: every rank gets some
    cold = Router.from_config(RoutingSection(policy="dynamo-kv"))
    _cache(cold, "p1", 0, 8)
    assert {cold.route(REQ, idle_cluster).key for _ in range(50)} == {("p1", 0)}


# ---- least-uncached-work ----------------------------------------------------------------------
def test_luw_cached_rank_wins_when_idle(cost, idle_cluster):
    r = _router("least-uncached-work", cost)
    _cache(r, "p1", 0, 8)
    d = r.route(REQ, idle_cluster)
    assert (d.instance, d.dp_rank) == ("p1", 0)
    assert d.predicted == PrefixHit(8 * BS, 0, 0)
    assert d.policy == "least-uncached-work"
    assert d.score == pytest.approx(cost.prefill_estimate_s("dep2", 165 - 128, 128))


@pytest.mark.parametrize(("queued_s", "winner"), [(0.010, ("p1", 0)), (0.020, ("p0", 0))])
def test_luw_hot_cached_rank_loses_to_idle_cold_one_when_its_queue_is_long(
    cost, idle_cluster, queued_s, winner
):
    # cached: 37 new tokens ~ 3.7 ms + queue; cold: 165 new tokens ~ 16.5 ms.
    r = _router("least-uncached-work", cost, lockstep_balance=False)
    _cache(r, "p1", 0, 8)
    d = r.route(REQ, _with(idle_cluster, ("p1", 0), queued_work_s=queued_s, queued_tokens=9999))
    assert (d.instance, d.dp_rank) == winner


def test_luw_pool_hits_are_charged_by_tier(cost, idle_cluster):
    r = _router("least-uncached-work", cost)
    pool = EventSequencer(Publisher("pool", 0))
    r.index.apply(pool.make("stored", "pool_dram", REQ.block_hashes[:8]))
    _cache(r, "p0", 1, 2)  # p0/1: 2 blocks in HBM, 6 more from pool DRAM
    d = r.route(REQ, idle_cluster)
    assert (d.instance, d.dp_rank) == ("p0", 1)
    assert d.predicted == PrefixHit(2 * BS, 0, 6 * BS)
    expected = cost.prefill_estimate_s("dep2", 165 - 128, 128) + cost.kv_transfer_s(
        6 * BS, "pool_dram"
    )
    assert d.score == pytest.approx(expected)


def test_luw_ties_go_to_the_less_loaded_rank(cost, idle_cluster):
    r = _router("least-uncached-work", cost)
    busy = _with(idle_cluster, ("p0", 0), queued_tokens=50)
    assert r.route(REQ, busy).key == ("p0", 1)
    busier = _with(_with(busy, ("p0", 1), queued_tokens=50), ("p1", 0), running_seqs=3)
    assert r.route(REQ, busier).key == ("p1", 1)


def test_luw_keeps_a_newcomer_off_an_idle_rank_whose_sibling_is_stepping(cost, idle_cluster):
    """A rank beside a busy sibling waits out the sibling's step in progress (lockstep): an idle
    instance's rank wins the tie it used to lose to the lower instance, and a prefix held in the busy
    instance's HBM keeps the request only while it saves more than that stall."""
    r = _router("least-uncached-work", cost)
    busy = _with(idle_cluster, ("p0", 0), queued_work_s=0.050, queued_tokens=500)
    assert r.route(REQ, busy).instance == "p1"  # not p0/1, idle but behind p0/0's step
    assert r.route(REQ, idle_cluster).key == ("p0", 0)  # all idle: the lowest, as before
    _cache(r, "p0", 1, 8)  # 8 of the prompt's 10 blocks in p0/1's HBM: 128 tokens not recomputed
    assert r.route(REQ, busy).instance == "p1"  # ... saves 12.8 ms, less than the 50 ms stall
    short = _with(idle_cluster, ("p0", 0), queued_work_s=0.005, queued_tokens=50)
    assert r.route(REQ, short).key == ("p0", 1)  # ... more than a 5 ms stall
    off = _router("least-uncached-work", cost, lockstep_balance=False)
    assert off.route(REQ, _with(idle_cluster, ("p0", 0), queued_work_s=0.050)).key == ("p0", 1)


def test_luw_compares_layouts_by_the_timing_model(cost, idle_cluster):
    tp8 = RankState("t9", 0, "tp8", "prefill")  # half the per-token time of a dep2 rank
    cluster = ClusterView((*idle_cluster.ranks, tp8))
    assert _router("least-uncached-work", cost).route(REQ, cluster).key == ("t9", 0)


# ---- dynamo-kv --------------------------------------------------------------------------------
def _dkv(**kw):
    return make_policy("dynamo-kv", PolicySettings(**kw))


def _dkv_cost(policy, rank: RankState, hbm: int = 0, pool: tuple[int, int] = (0, 0)) -> float:
    """dynamo-kv's cost of REQ (11 blocks of 16) on `rank` holding `hbm` leading blocks, with a
    rack pool holding `pool` = (spare-HBM, DRAM) blocks right after them."""
    from rackserve.routing import PrefixMatch

    match = PrefixMatch(BS, REQ.prompt_tokens, {rank.key: hbm} if hbm else {}, {hbm: pool, 0: pool})
    return policy.cost(REQ, rank, match)


P = RankState("p1", 0, "dep2", "prefill")


def test_dynamo_prefill_term_is_active_prefill_plus_prompt_blocks_minus_device_credit():
    # active prefill 32 tokens = 2 blocks; prompt 11 blocks; 8 in HBM: prefill 2 + 11 - 8 = 5,
    # new blocks 11 - 8 = 3
    rank = dataclasses.replace(P, queued_tokens=32)
    assert _dkv_cost(_dkv(), rank, hbm=8) == 5 + 3
    assert _dkv_cost(_dkv(), rank) == 13 + 11  # cold: no credit, every block new


def test_dynamo_prefill_load_scale_scales_only_the_adjusted_prefill_blocks():
    rank = dataclasses.replace(P, queued_tokens=32, active_decode_blocks=4)
    assert _dkv_cost(_dkv(prefill_load_scale=2.0), rank, hbm=8) == 2.0 * 5 + 4 + 3


def test_dynamo_adjusted_prefill_is_clamped_at_zero():
    # a credit of 3 per device block: 2 + 11 - 24 < 0 -> 0; only the decode side remains
    rank = dataclasses.replace(P, queued_tokens=32)
    assert _dkv_cost(_dkv(overlap_score_credit=3.0), rank, hbm=8) == 0 + 3


def test_dynamo_decode_term_is_active_decode_blocks_plus_new_blocks():
    rank = dataclasses.replace(P, active_decode_blocks=7)
    assert _dkv_cost(_dkv(), rank, hbm=8) == (11 - 8) + 7 + (11 - 8)
    assert _dkv_cost(_dkv(), rank, hbm=11) == 0 + 7 + 0  # every block held: nothing new


def test_dynamo_overlap_credit_is_weighted_by_tier():
    # 4 blocks in spare HBM, 4 in DRAM of the pool: credit 0.5 x 4 + 0.25 x 4 = 3; pooled blocks
    # are still new on the rank (they must be allocated there)
    policy = _dkv(pool_hbm_hit_weight=0.5, host_cache_hit_weight=0.25)
    assert _dkv_cost(policy, P, pool=(4, 4)) == (11 - 3) + 11
    assert _dkv_cost(_dkv(), P, pool=(4, 4)) == (11 - 0.75 * 8) + 11  # Dynamo's default 0.75


def test_dynamo_targets_are_worker_and_dp_rank(idle_cluster):
    # the two ranks of one instance are separate targets: the one with less active prefill wins
    r = _router("dynamo-kv")
    _cache(r, "p1", 0, 8)
    _cache(r, "p1", 1, 8)
    cluster = _with(idle_cluster, ("p1", 0), queued_tokens=64)
    assert r.route(REQ, cluster).key == ("p1", 1)


def test_dynamo_deprecated_overlap_score_weight_maps_as_dynamo_maps_it():
    rank = dataclasses.replace(P, queued_tokens=32, active_decode_blocks=4)
    assert _dkv_cost(_dkv(overlap_score_weight=2.0), rank, hbm=8) == 2.0 * 5 + 4 + 3  # = prefill_load_scale
    assert _dkv_cost(_dkv(overlap_score_weight=0.0), rank, hbm=8) == 0 + 4 + 3  # and no credit
    legacy = Router.from_config(RoutingSection(policy="dynamo-kv", overlap_score_weight=0.0))
    assert _dkv_cost(legacy.policy, rank, hbm=8) == 0 + 4 + 3


def test_dynamo_cached_wins_idle_and_loses_to_decode_load(idle_cluster):
    r = _router("dynamo-kv")
    _cache(r, "p1", 0, 8)
    assert r.route(REQ, idle_cluster).key == ("p1", 0)  # 3 + 3 against 11 + 11
    assert r.route(REQ, _with(idle_cluster, ("p1", 0), active_decode_blocks=17)).key != ("p1", 0)


def test_dynamo_temperature_samples_softmax_seeded(idle_cluster):
    def picks(seed: int) -> list[tuple[str, int]]:
        r = _router("dynamo-kv", temperature=0.5, seed=seed)
        _cache(r, "p1", 0, 8)
        return [r.route(REQ, idle_cluster).key for _ in range(2000)]

    first = picks(3)
    assert first == picks(3)
    counts = Counter(first)
    assert len(counts) == 4
    # normalised costs 1 (cold) vs 0 (cached): odds e^(1/0.5) = 7.39 per cold rank
    share = counts[("p1", 0)] / 2000
    assert share == pytest.approx(7.389 / (7.389 + 3), abs=0.04)
    with pytest.raises(ValueError, match="temperature"):
        make_policy("dynamo-kv", PolicySettings(temperature=-1))


# ---- baselines ---------------------------------------------------------------------------------
def test_round_robin_cycles_over_healthy_ranks(idle_cluster):
    r = _router("round-robin")
    cluster = _with(idle_cluster, ("p0", 1), healthy=False)
    assert [r.route(REQ, cluster).key for _ in range(4)] == [
        ("p0", 0),
        ("p1", 0),
        ("p1", 1),
        ("p0", 0),
    ]


def test_random_is_seeded_and_uniform(idle_cluster):
    r1, r2, r3 = _router("random", seed=1), _router("random", seed=1), _router("random", seed=2)
    s1 = [r1.route(REQ, idle_cluster).key for _ in range(400)]
    assert s1 == [r2.route(REQ, idle_cluster).key for _ in range(400)]
    assert s1 != [r3.route(REQ, idle_cluster).key for _ in range(400)]
    assert all(80 <= n <= 120 for n in Counter(s1).values()) and len(Counter(s1)) == 4


def test_least_loaded_ignores_cache(idle_cluster):
    r = _router("least-loaded")
    _cache(r, "p0", 0, 10)
    cluster = ClusterView(
        tuple(
            dataclasses.replace(x, queued_work_s=0.5) if x.role == "prefill" else x
            for x in idle_cluster.ranks
        )
    )
    cluster = _with(cluster, ("p1", 1), queued_work_s=0.1)
    d = r.route(REQ, cluster)
    assert d.key == ("p1", 1) and d.predicted == PrefixHit()


def _prefixed(i: int, tail: int) -> RequestView:
    tokens = [i] * (4 * BS) + [tail] * (3 * BS)
    return RequestView(tuple(block_hashes(tokens, BS, "m")), len(tokens), BS)


def test_prefix_hash_keeps_a_prefix_on_one_rank_and_moves_only_a_lost_ranks_keys(idle_cluster):
    r = _router("prefix-hash")
    placed = {i: r.route(_prefixed(i, 1), idle_cluster).key for i in range(200)}
    assert all(r.route(_prefixed(i, 2), idle_cluster).key == placed[i] for i in range(200))
    assert (
        all(n >= 20 for n in Counter(placed.values()).values()) and len(set(placed.values())) == 4
    )
    without = _with(idle_cluster, ("p1", 0), healthy=False)
    moved = {i for i in range(200) if r.route(_prefixed(i, 1), without).key != placed[i]}
    assert moved == {i for i, k in placed.items() if k == ("p1", 0)}


# ---- least-uncached-work shortcut == brute force ----------------------------------------------
_rank_st = st.tuples(
    st.sampled_from(["dep2", "tp8"]),
    st.sampled_from([0.0, 0.001, 0.002, 0.01]),  # few values: ties happen
    st.integers(0, 3),
    st.integers(0, 2),
    st.booleans(),
    st.integers(0, 10),  # HBM blocks of the prompt on this rank
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_rank_st, min_size=1, max_size=10), st.integers(0, 10), st.integers(0, 10))
def test_luw_pick_equals_brute_force_argmin(cost, rows, pool_hbm, pool_dram):
    from rackserve.routing import PrefixMatch
    from rackserve.routing.policies.least_uncached import uncached_work_s

    ranks = tuple(
        RankState(
            f"i{i // 2}",
            i % 2,
            lay,
            "prefill",
            queued_tokens=qt,
            queued_work_s=q,
            running_seqs=rs,
            healthy=ok,
        )
        for i, (lay, q, qt, rs, ok, _) in enumerate(rows)
    )
    if not any(r.healthy for r in ranks):
        return
    blocks = {r.key: row[5] for r, row in zip(ranks, rows, strict=True) if row[5]}
    starts = {0, *blocks.values()}
    match = PrefixMatch(BS, REQ.prompt_tokens, blocks, {s: (pool_hbm, pool_dram) for s in starts})
    cluster = ClusterView(ranks)
    for balance in (False, True):
        policy = make_policy("least-uncached-work", PolicySettings(cost=cost, lockstep_balance=balance))
        pick = policy.choose(REQ, cluster, match)

        def brute_key(r: RankState, balance=balance):
            work = uncached_work_s(
                cost, r.layout, match.tokens(blocks.get(r.key, 0)), REQ.prompt_tokens
            )
            done = r.queued_work_s + work
            siblings = [s.queued_work_s for s in ranks if s.instance == r.instance]
            if balance and len(siblings) > 1:
                full = cost.prefill_estimate_s(r.layout, getattr(cost, "reference_chunk_tokens", 8192), 0)
                stall = min(max(siblings) - r.queued_work_s, full)
                # in the policy's order, (done + idle) + stall: a tie must not turn on one ulp
                done = done + max(0.0, done - max(siblings)) + max(0.0, stall)
            return (done, r.load_order)

        want = min((r for r in ranks if r.healthy), key=brute_key)
        assert pick.rank == want


def test_luw_skips_an_unhealthy_cached_rank_and_short_prompts_work(cost, idle_cluster):
    r = _router("least-uncached-work", cost)
    _cache(r, "p1", 0, 8)
    assert r.route(REQ, _with(idle_cluster, ("p1", 0), healthy=False)).key == ("p0", 0)
    short = RequestView((), 9, BS)  # shorter than one block: nothing to match
    for name in ("least-uncached-work", "dynamo-kv", "prefix-hash", "round-robin"):
        d = _router(name, cost).route(short, idle_cluster)
        assert d.predicted == PrefixHit() and d.key in {r.key for r in idle_cluster.prefill_ranks()}


@pytest.mark.parametrize("scoped", [False, True])
def test_uncached_work_is_priced_once_per_layout_hbm_blocks_and_reachable_pool(cost, scoped):
    """UncachedWork (least-uncached-work and regret) gives every rank the price uncached_work_s gives it,
    pricing each distinct (layout, HBM blocks, pool) once; with a pool per instance, equal HBM blocks
    on two instances reach different pools and are priced apart, unless their pools give the same
    hit (p1 and p2 here), which is priced once."""
    from rackserve.routing.match import PrefixMatch
    from rackserve.routing.policies.least_uncached import UncachedWork, uncached_work_s

    pools = {"p0": (30, 10), "p1": (5, 5), "p2": (5, 5)} if scoped else None
    match = PrefixMatch(16, 16 * 50, {("p0", 0): 20}, {0: (12, 3), 20: (4, 6)}, pools)
    calls = []

    class Counting(type(cost)):
        def prefill_estimate_s(self, *a):
            calls.append(a)
            return super().prefill_estimate_s(*a)

    counting = Counting()
    work = UncachedWork(counting, match, match.prompt_tokens)
    ranks = [("dep2", "p0", 0), ("dep2", "p0", 1), ("dep2", "p1", 0), ("dep2", "p1", 1), ("tp8", "p1", 1),
             ("dep2", "p2", 0), ("tp8", "p2", 1)]
    for layout, inst, rank in ranks:
        hbm = match.hbm_blocks((inst, rank))
        want = uncached_work_s(cost, layout, match.tokens(hbm, inst), match.prompt_tokens)
        assert work(layout, hbm, inst) == want
    # distinct prices: p0/0 (20 blocks), the cold dep2 ranks (one pool, or one per instance), tp8
    assert len(calls) == (4 if scoped else 3)


@pytest.mark.parametrize("seed", range(4))
def test_regret_by_load_equals_pricing_every_rank(cost, seed):
    """regret_s given the cluster view (each layout's least-loaded cold rank, the holders and the
    chosen rank priced) equals regret_s over every prefill rank, bit for bit: random queues (with
    ties), holders, pool runs and chosen ranks, on the live view and on a frozen ClusterView."""
    import random

    from rackserve.routing.match import PrefixMatch
    from rackserve.routing.regret import regret_s
    from rackserve.sim.live_view import LiveClusterView

    rng = random.Random(seed)
    layouts = ["dep2", "tp8", "wide-ep"]
    checked = 0
    for _ in range(200):
        ranks = []
        for i in range(rng.randint(1, 6)):
            layout = rng.choice(layouts)
            for d in range(rng.choice([1, 2, 4])):
                q = rng.choice([0.0, 0.5, 1e-3 * rng.randint(0, 50), rng.random()])
                ranks.append(RankState(f"p{i}", d, layout, "prefill", rng.randint(0, 9000), q, 0, rng.randint(0, 4)))
        ranks.append(RankState("d0", 0, "wide-ep", "decode"))
        frozen, live = ClusterView(tuple(ranks)), LiveClusterView(ranks)
        prefill = [r for r in ranks if r.role == "prefill"]
        held = {r.key: rng.randint(1, 30) for r in rng.sample(prefill, rng.randint(0, min(3, len(prefill))))}
        if rng.random() < 0.3:
            held[("d0", 0)] = 5  # a decode rank's cache: never a target
        pool = {s: (rng.randint(0, 10), rng.randint(0, 10)) for s in {0, *held.values()}}
        match = PrefixMatch(16, rng.randint(2, 900), held, pool)
        req = RequestView((), match.prompt_tokens, 16)
        for chosen in {rng.choice(prefill).key, *held}:
            want = regret_s(cost, req, frozen.prefill_ranks(), match, chosen)
            assert regret_s(cost, req, frozen.prefill_ranks(), match, chosen, cluster=frozen) == want
            assert regret_s(cost, req, live.prefill_ranks(), match, chosen, cluster=live) == want
            checked += want > 0
    assert checked > 50  # regrets that are not zero were compared too
