"""The router books a request's load on its prefill and decode ranks at the routing decision, for
the front door (RouterCore.route) and the gRPC Route service alike, so a burst of concurrent
requests spreads over the decode ranks (the old router counted decode load only after the prefill
reply, and the gRPC path never: a burst landed on one decode rank)."""

from __future__ import annotations

import asyncio
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from rackserve.config import RoutingSection
from rackserve.kv.block_hash import block_hashes
from rackserve.metrics import ProcessMetrics
from rackserve.routing.router import Router
from rackserve.routing.timing_cost import TimingCost
from rackserve.timing import TimingModel
from services._proto import router_pb2, router_pb2_grpc
from services.router.__main__ import RouterService
from services.router.router_core import RouterCore
from services.topology import InstanceSpec

BLOCK = 16
DECODE_RANKS = 4


COST = TimingCost(TimingModel.create())


def make_core() -> RouterCore:
    prefill = [InstanceSpec("prefill-dep2-0", "prefill", "dep2", 2, 2)]
    decode = [InstanceSpec("decode-wide-ep-0", "decode", "wide-ep", DECODE_RANKS, DECODE_RANKS)]
    router = Router.from_config(RoutingSection(), cost=COST)
    return RouterCore(prefill, decode, router, BLOCK, ProcessMetrics("m"), cost=COST)


def prompt(i: int) -> list[int]:
    return [(i * 7919 + t) % 250 + 1 for t in range(100)]


def decode_spread(ranks: list[int]) -> tuple[int, int]:
    counts = Counter(ranks)
    per_rank = [counts.get(r, 0) for r in range(DECODE_RANKS)]
    return min(per_rank), max(per_rank)


@pytest.mark.parametrize("burst", [8, 13])
def test_a_concurrent_burst_spreads_over_decode_ranks_within_one(burst: int) -> None:
    core = make_core()

    def route(i: int):
        return core.route(f"r{i}", prompt(i), block_hashes(prompt(i), BLOCK, "m"), max_tokens=64)

    with ThreadPoolExecutor(max_workers=burst) as pool:  # all in flight at once, none finished
        routes = list(pool.map(route, range(burst)))
    low, high = decode_spread([r.decode_rank for r in routes])
    assert high - low <= 1, Counter(r.decode_rank for r in routes)
    prefill = Counter(r.prefill_rank for r in routes)
    assert max(prefill.values()) - min(prefill.values()) <= 1, prefill  # the prefill load too
    for r in routes:
        core.release(r)
    state = core.snapshot().ranks
    assert all(s.running_seqs == 0 and s.active_decode_blocks == 0 for s in state)
    assert all(s.queued_tokens == 0 and abs(s.queued_work_s) < 1e-12 for s in state)


def test_release_is_by_part_idempotent_and_keeps_a_newer_booking() -> None:
    core = make_core()
    first = core.route("a", prompt(1), block_hashes(prompt(1), BLOCK, "m"), max_tokens=16)
    decode_key = (first.decode_instance, first.decode_rank)
    core.release(first, ("prefill",))
    core.release(first, ("prefill",))
    ranks = {(s.instance, s.dp_rank): s for s in core.snapshot().ranks}
    assert ranks[decode_key].active_decode_blocks == -(-(100 + 16) // BLOCK)  # decode still held
    assert sum(s.queued_tokens for s in ranks.values()) == 0
    again = core.route("a", prompt(1), block_hashes(prompt(1), BLOCK, "m"))  # routed again: replaces
    core.release(first)  # the stale route releases nothing
    assert sum(s.running_seqs for s in core.snapshot().ranks) == 2
    assert core.release_id("a") and not core.release_id("a")
    assert again.booking.decode_blocks == -(-100 // BLOCK)
    assert sum(s.running_seqs for s in core.snapshot().ranks) == 0


def test_the_grpc_route_path_books_the_same_way() -> None:
    async def scenario() -> tuple[list[int], bool]:
        core = make_core()
        server = grpc.aio.server()
        router_pb2_grpc.add_RouterServicer_to_server(RouterService(core, 60.0), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = router_pb2_grpc.RouterStub(channel)
                calls = [
                    stub.Route(router_pb2.RouteRequest(
                        request_id=f"g{i}", token_ids=prompt(i),
                        block_hashes=block_hashes(prompt(i), BLOCK, "m"), max_tokens=32))
                    for i in range(8)
                ]
                decisions = await asyncio.gather(*calls)
                released = await stub.Release(router_pb2.ReleaseRouteRequest(request_id="g0"))
                return [d.decode.rank for d in decisions], released.released
        finally:
            await server.stop(0)

    ranks, released = asyncio.run(scenario())
    low, high = decode_spread(ranks)
    assert high - low <= 1, Counter(ranks)
    assert released
