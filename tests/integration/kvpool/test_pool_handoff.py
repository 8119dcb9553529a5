"""Reads are leased (issue 17 item 3): a fetch holds its blocks while it reads them, and a writer's
put(hold=True) holds the blocks it hands to a reader on another rank (the P->D hand-off) until the
reader releases the lease. Real pool service, real Redis; eviction pressure from another writer.
No sleeps: the reader's lease releases are awaited (PoolClient.flush_releases)."""

from __future__ import annotations

import pytest

from rackserve.kv.pool_tiers import PoolLimits
from services.kv_link import PoolLink
from services.kvpool.client import PoolClient

from .test_pool_service import chain, payloads

pytestmark = pytest.mark.integration
BLOCK = 1000
HBM_BLOCKS = 8  # high watermark 0.9: the 8th block evicts down to half the tier


def limits() -> PoolLimits:
    return PoolLimits(HBM_BLOCKS * BLOCK, 0, 1 << 40, 0.9, 0.5, 30.0)


def pressure(client: PoolClient, seed: int) -> None:
    """Fill the tier twice over with single-block chains: every unleased older block is evicted."""
    for i in range(2 * HBM_BLOCKS):
        client.put(chain(1, seed=seed * 1000 + i), payloads(1, seed=i))


def test_a_fetch_holds_its_blocks_while_it_reads_them(make_pool) -> None:
    server, writer = make_pool(limits())
    other = PoolClient(server.address, owner="pressure")
    hashes, values = chain(4, seed=1), payloads(4, seed=1)
    assert writer.put(hashes, values).ok
    found = writer.lookup(hashes)  # leased from here ...
    assert found.lease_id and all(found.tiers)
    pressure(other, seed=2)  # ... so eviction between the lookup and the read cannot take them
    assert writer.read(found).values == tuple(values)
    writer.flush_releases()
    assert server.servicer.stats().active_leases == 0
    pressure(other, seed=3)
    assert writer.match_prefix(hashes).count == 0  # released: now they go
    other.close()


def test_a_handed_off_chain_stays_until_the_reader_has_read_it(make_pool) -> None:
    server, prefill = make_pool(limits())
    other = PoolClient(server.address, owner="pressure")
    decode = PoolLink(server.address, owner="decode")
    hashes, values = chain(4, seed=4), payloads(4, seed=4)
    put = prefill.put(hashes, values, hold=True)
    assert put.ok and put.lease_id
    pressure(other, seed=5)  # between the prefill's commit and the decode's fetch
    assert [v for _, v, _ in decode.fetch(hashes, handoff_lease=put.lease_id)] == values
    decode.client.flush_releases()
    assert server.servicer.stats().active_leases == 0  # the read's lease and the hand-off's
    pressure(other, seed=6)
    assert prefill.match_prefix(hashes).count == 0
    other.close()
    decode.client.close()


def test_holding_blocks_that_were_already_stored_leases_them_too(make_pool) -> None:
    server, client = make_pool(limits())
    hashes = chain(3, seed=7)
    assert client.put(hashes, payloads(3)).ok
    again = client.put(hashes, payloads(3), hold=True)  # nothing to write: no commit call
    assert again.stored == tuple(hashes) and again.written == () and again.lease_id
    assert server.servicer.stats().active_leases == 1
    other = PoolClient(server.address, owner="pressure")
    pressure(other, seed=8)
    assert client.match_prefix(hashes).count == 3
    other.close()
