"""Fewer round trips on the first token's path (issue 19 item 2), same guarantees: the hand-off's
lease carries each block's tier, so the decode rank reads the bytes straight from Redis without
asking the pool (no BatchGet); a prefill books its blocks' space while it computes them and
commits into that booking afterwards. A block is still visible only once committed, a booking
that no longer fits (other blocks, other sizes, about to lapse) is given back and booked anew,
and a lapsed hand-off lease whose blocks were evicted reads as a miss. Real pool, real Redis."""

from __future__ import annotations

import pytest

from rackserve.kv.pool_tiers import PoolLimits
from services.kv_link import PoolLink
from services.kvpool.client import PoolClient

from .test_pool_handoff import BLOCK, limits, pressure
from .test_pool_service import chain, payloads
from .test_rank_worker import run, worker

pytestmark = pytest.mark.integration


def test_the_decode_reads_a_handed_off_chain_without_asking_the_pool(make_pool) -> None:
    server, _ = make_pool(limits())
    prefill, decode = PoolLink(server.address, "prefill"), PoolLink(server.address, "decode")
    hashes, values = chain(4, seed=11), payloads(4, seed=11)
    handle = prefill.store(list(zip(hashes, values, strict=True)), hold=True)
    assert handle.hashes == tuple(hashes) and handle.lease_id
    assert handle.tiers == ("pool_hbm",) * 4
    gets = server.servicer.stats().gets
    other = PoolClient(server.address, owner="pressure")
    pressure(other, seed=12)  # the lease still keeps them
    got = decode.fetch(hashes, handoff_lease=handle.lease_id, handoff_tiers=handle.tiers)
    assert [(h, v, t) for h, v, t in got] == [(h, v, "pool_hbm") for h, v in zip(hashes, values, strict=True)]
    assert server.servicer.stats().gets == gets  # no lookup: the old code made one BatchGet here
    decode.client.flush_releases()
    assert server.servicer.stats().active_leases == 0  # the hand-off's lease was given back
    for link in (prefill, decode):
        link.client.close()
    other.close()


def test_a_lapsed_hand_off_whose_blocks_were_evicted_reads_as_a_miss(make_pool) -> None:
    clock = [0.0]
    server, _ = make_pool(PoolLimits(8 * BLOCK, 0, 1 << 40, 0.9, 0.5, 5.0), clock=lambda: clock[0])
    prefill, decode = PoolLink(server.address, "prefill"), PoolLink(server.address, "decode")
    hashes, values = chain(3, seed=13), payloads(3, seed=13)
    handle = prefill.store(list(zip(hashes, values, strict=True)), hold=True)
    clock[0] = 10.0  # the lease lapsed ...
    other = PoolClient(server.address, owner="pressure")
    pressure(other, seed=14)  # ... and eviction took the blocks
    server.store.flush()  # their bytes are deleted
    assert decode.fetch(hashes, handoff_lease=handle.lease_id, handoff_tiers=handle.tiers) == []
    for link in (prefill, decode):
        link.client.close()
    other.close()


def test_a_booking_made_before_the_compute_is_committed_into(make_pool) -> None:
    server, client = make_pool(limits())
    link = PoolLink(server.address, "prefill")
    hashes, values = chain(3, seed=15), payloads(3, seed=15)
    res = link.reserve(hashes, BLOCK)
    assert client.match_prefix(hashes).count == 0  # booked, not visible
    puts = server.servicer.stats().puts
    handle = link.store(list(zip(hashes, values, strict=True)), hold=True, reservation=res)
    assert handle.hashes == tuple(hashes) and handle.lease_id
    assert server.servicer.stats().puts == puts  # committed into the booking: no second Reserve
    assert client.get(hashes).values == tuple(values)
    link.client.close()


@pytest.mark.parametrize("case", ["other_sizes", "other_blocks", "lapsing"])
def test_a_booking_that_does_not_fit_is_given_back_and_booked_anew(make_pool, case) -> None:
    clock = [0.0]
    server, client = make_pool(limits(), clock=lambda: clock[0])
    link = PoolLink(server.address, "prefill")
    hashes, values = chain(3, seed=16), payloads(3, seed=16)
    booked = {"other_sizes": (hashes, BLOCK + 1), "other_blocks": (hashes[:2], BLOCK),
              "lapsing": (hashes, BLOCK)}[case]
    res = link.reserve(*booked)
    if case == "lapsing":  # the booking lapses (client side: its deadline is in the past)
        res = type(res)(res.hashes, res.sizes, res.statuses, res.txn, 0.0)
    handle = link.store(list(zip(hashes, values, strict=True)), hold=True, reservation=res)
    assert handle.hashes == tuple(hashes)
    assert client.get(hashes).values == tuple(values)
    assert server.servicer.tiers.usage("pool_hbm").bytes == 3 * BLOCK  # the old booking was given back
    link.client.close()


def test_a_prefill_rank_books_while_computing_and_the_decode_rank_reads_without_a_lookup(
    make_pool, redis_server
) -> None:
    prompt = [t % 200 + 1 for t in range(83)]  # 5 full blocks + 3 tokens
    server, client = make_pool(PoolLimits(1 << 30, 0, 1 << 40, 0.9, 0.5, 30.0))
    prefill = worker(server, redis_server, 64, 0)
    puts = server.servicer.stats().puts
    ((_, _, emitted),) = run(prefill, {"p": prompt}, max_tokens=3).values()
    assert server.servicer.stats().puts == puts + 1  # one Reserve, made at admission
    assert len(emitted.kv_block_hashes) == 5 and emitted.kv_block_tiers == ("pool_hbm",) * 5
    decode = worker(server, redis_server, 64, 0, role="decode")
    gets = server.servicer.stats().gets
    admitted = decode.submit_decode("d", prompt, emitted.token, list(emitted.kv_block_hashes),
                                    {"max_tokens": 3}, emitted.kv_lease_id, emitted.kv_block_tiers)
    assert admitted.pool_hbm_tokens == 5 * 16
    assert server.servicer.stats().gets == gets
    step = decode.step()
    assert int(step.batch.new_tokens[0]) == 3 + 1 and int(step.batch.cached_tokens[0]) == 5 * 16
    decode.pool.client.flush_releases()
    assert client.stats().active_leases == 0
