"""The router process: HTTP front door + gRPC Router service + KV-event consumer, one event loop.

    python -m services.router --config FILE --http-port 8000 --grpc-port P \
        --prefill 127.0.0.1:P1 --decode 127.0.0.1:P2 --redis-url redis://127.0.0.1:R/0
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import threading
import time

import grpc
import redis
import uvicorn

from rackserve.config import Config, load_config
from rackserve.metrics import ProcessMetrics
from rackserve.routing.router import Router
from rackserve.routing.timing_cost import TimingCost
from rackserve.timing import TimingModel
from services import kvevents
from services._proto import (
    prefill_pb2,
    router_pb2,
    router_pb2_grpc,
)
from services.event_loop import run, uvicorn_options
from services.grpc_limits import SERVER_OPTIONS
from services.rank_probe import PROBE_TIMEOUT_S
from services.router.app import FrontDoor, create_app
from services.router.limits import check_bind, guard
from services.router.orchestrator import Orchestrator
from services.router.planner_loop import LivePlanner
from services.router.readiness import ROLES, Readiness
from services.router.router_core import RouterCore
from services.router.worker_metrics import WorkerMetrics
from services.stage_timer import stamp_arrival
from services.topology import instances


class RouterService(router_pb2_grpc.RouterServicer):
    """gRPC face of the same RouterCore the front door uses."""

    def __init__(self, core: RouterCore, booking_ttl_s: float) -> None:
        self.core = core
        self.booking_ttl_s = booking_ttl_s  # a booking the caller never releases lapses then

    async def Route(
        self, request: router_pb2.RouteRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.RouteDecision:
        if not request.token_ids:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "token_ids: must not be empty")
        route = self.core.route(
            request.request_id,
            list(request.token_ids),
            list(request.block_hashes),
            request.max_tokens,
        )
        asyncio.get_running_loop().call_later(self.booking_ttl_s, self.core.release, route)
        return router_pb2.RouteDecision(
            prefill=router_pb2.RankTarget(instance=route.prefill_instance, rank=route.prefill_rank),
            decode=router_pb2.RankTarget(instance=route.decode_instance, rank=route.decode_rank),
            predicted_hit_tokens=route.predicted_hit_tokens,
            policy=route.policy,
        )

    async def Release(
        self, request: router_pb2.ReleaseRouteRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.ReleaseRouteReply:
        return router_pb2.ReleaseRouteReply(released=self.core.release_id(request.request_id))

    async def Health(
        self, request: router_pb2.RouterHealthRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.RouterHealthReply:
        return router_pb2.RouterHealthReply(ready=True, policy=self.core.policy_name)


REDIS_TIMEOUT_S = 1.0  # a Redis that does not answer within this (plus the 200 ms block) is lost


def follow_kv_events(
    core: RouterCore, redis_url: str, stop: threading.Event, readiness: Readiness
) -> None:
    """Feed the router's prefix index from the Redis Stream (replays what is kept on start);
    `readiness.redis` says whether the last read reached Redis (the front door's /ready uses it)."""
    client = redis.Redis.from_url(
        redis_url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
    )
    reader = kvevents.KVEventReader(client)
    gaps = 0
    while not stop.is_set():
        try:
            events = reader.read_batch(count=1000, block_ms=200)
            readiness.redis = True
        except redis.RedisError:
            readiness.redis = False
            stop.wait(0.5)
            continue
        if events:
            core.apply_events(events, len(reader.gaps) - gaps)
            gaps = len(reader.gaps)
            # Event lag: Redis stamps each stream entry id with its XADD time in ms ("ms-seq").
            added_s = int(reader.last_id.split("-")[0]) / 1000.0
            core.metrics.router.event_lag.observe(max(0.0, time.time() - added_s))


async def watch_workers(
    orchestrator: Orchestrator, readiness: Readiness, interval_s: float,
    ranks: dict[tuple[str, int], dict],
) -> None:
    """Poll the workers' Health over the channels requests take (a reply also says those are
    connected): `readiness.answered` for /ready, routing leaves out the ranks each worker's probe
    found unresponsive (services/rank_probe.py), and `ranks` keeps where each rank runs and what
    it last did (/admin/ranks)."""
    core = orchestrator.router
    while True:
        for role in ROLES:
            try:
                reply = await orchestrator.worker_health(role, PROBE_TIMEOUT_S + 3)
            except grpc.aio.AioRpcError:
                readiness.answered[role] = False
                continue
            core.apply_probe(list(reply.instances), set(reply.unresponsive))
            for key in [k for k in ranks if k[0].startswith(f"{role}-") and k[0] not in reply.instances]:
                del ranks[key]  # stopped by the planner
            ranks.update(rank_details(reply))
            readiness.answered[role] = reply.ready
        await asyncio.sleep(interval_s if all(readiness.answered.values()) else 0.2)


def rank_details(reply: prefill_pb2.WorkerHealthReply) -> dict[tuple[str, int], dict]:
    """(instance, rank) -> node, pid, state and last step, from one worker's Health reply."""
    out = {}
    for r in reply.ranks:
        state = "busy" if r.running or r.waiting else "idle"
        if f"{r.instance}/{r.rank}" in reply.unresponsive:
            state = "unresponsive"
        out[(r.instance, r.rank)] = {
            "node": r.node, "pid": r.pid, "state": state, "running": r.running,
            "waiting": r.waiting, "steps": r.steps,
            "last_step_unix_s": round(r.last_step_unix_s, 3) or None,
        }
    return out


def build_core(cfg: Config, timing: TimingModel, metrics: ProcessMetrics) -> RouterCore:
    cost = TimingCost.from_config(cfg, timing)
    for spec in instances(cfg, "prefill"):  # tabulate now (~0.5 s a layout), not on the first request
        cost.prefill_estimate_s(spec.layout, 1, 0)
    router = Router.from_config(cfg.routing, cost=cost)
    return RouterCore(
        instances(cfg, "prefill"),
        instances(cfg, "decode"),
        router,
        cfg.engine.block_size,
        metrics,
        cost=cost,
    )


async def serve(args: argparse.Namespace) -> None:
    cfg = load_config(args.config)
    check_bind(cfg.cluster.model_copy(update={"host": args.host}), "router")
    timing = TimingModel.from_section(cfg.timing)
    metrics = ProcessMetrics(cfg.engine.model_id)
    for key in (key for spec in instances(cfg, "decode") for key in spec.ranks()):
        metrics.vllm.declare_requests(key.engine)  # vLLM makes every engine's series at start
    core = build_core(cfg, timing, metrics)
    metrics.front_door.time_scale.set(cfg.cluster.time_scale)
    orchestrator = Orchestrator(
        core,
        args.prefill,
        args.decode,
        cfg.engine.model_id,
        cfg.engine.block_size,
        cfg.cluster.worker_timeout_s,
        cfg.cluster.decode_chunk_timeout_s,
        time_scale=cfg.cluster.time_scale,
    )
    planner = LivePlanner(cfg, orchestrator, timing, metrics) if cfg.planner is not None else None
    readiness = Readiness(core.routable, orchestrator.connected)
    ranks: dict[tuple[str, int], dict] = {}
    workers = WorkerMetrics(args.worker_metrics or [])
    door = FrontDoor(
        orchestrator,
        metrics,
        cfg.engine.model_id,
        cfg.engine.max_context,
        ready=readiness.ready,
        waiting_for=readiness.waiting_for,
        merge_metrics=workers.merged_with,
        instance_id=args.instance_id,
        worker_ranks=ranks,
        planner=planner,
    )
    grpc_server = grpc.aio.server(options=SERVER_OPTIONS)
    router_pb2_grpc.add_RouterServicer_to_server(RouterService(core, cfg.cluster.worker_timeout_s), grpc_server)
    grpc_server.add_insecure_port(f"{args.host}:{args.grpc_port}")
    await grpc_server.start()
    stop = threading.Event()
    follower = threading.Thread(
        target=follow_kv_events, args=(core, args.redis_url, stop, readiness), daemon=True
    )
    follower.start()
    watcher = asyncio.create_task(
        watch_workers(orchestrator, readiness, cfg.cluster.health_interval_s, ranks)
    )
    planning = asyncio.create_task(planner.loop()) if planner is not None else None
    http = uvicorn.Server(
        uvicorn.Config(
            stamp_arrival(guard(create_app(door), cfg.cluster), metrics),
            host=args.host,
            port=args.http_port,
            log_level="warning",
            lifespan="off",
            **uvicorn_options(),
        )
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: setattr(http, "should_exit", True))
    try:
        await http.serve()
    finally:
        watcher.cancel()
        if planning is not None:
            planning.cancel()
        stop.set()
        await orchestrator.close()
        await workers.close()
        await grpc_server.stop(grace=1)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m services.router")
    parser.add_argument("--config", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--prefill", required=True, help="prefill service host:port")
    parser.add_argument("--decode", required=True, help="decode service host:port")
    parser.add_argument("--redis-url", required=True)
    parser.add_argument(
        "--instance-id", default="", help="echoed by /ready, so a launcher knows its own router"
    )
    parser.add_argument("--worker-metrics", nargs="*", help="worker /metrics URLs merged into ours")
    run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
