"""What the prefill and decode service processes share: joining Ray, placing one instance's rank
actors with a placement group, pricing its steps with the cost model, serving /metrics.

Each rank actor asks for a fraction of a CPU (`RANK_CPUS`) so a DEP2 instance, a 4-rank Wide-EP
instance and a TP8 instance fit on a 2-core machine; on a real cluster set it in the placement.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import grpc
import ray
from prometheus_client import start_http_server
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rackserve.config import Config, load_config
from rackserve.metrics import ProcessMetrics
from rackserve.timing import TimingModel
from rackserve.timing.batch import StepBatch, StepCost
from services.grpc_limits import SERVER_OPTIONS
from services.instance_loop import InstanceLoop, StepDone
from services.rank_group import GroupedRank, InProcessGroup, RankGroup, StepBatcher
from services.rank_idle import RankIdleExport
from services.rank_worker import RankWorker
from services.step_memo import StepMemo
from services.topology import InstanceSpec, instances, running_at_start

JOIN_ATTEMPTS = 5
RANK_CPUS = 0.1  # CPU share reserved per rank actor (the twin's math is small)
LOCAL_RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
}

RayRankWorker = ray.remote(RankWorker)


def named_rank_actor(rank: str):  # -> ray.actor.ActorClass
    """RankWorker's actor form under the rank's name: Ray titles an actor's process
    `ray::<class name>` (ps, top) and lists that class name, so each rank shows as
    `ray::Rank(decode-tp8-0/0)` rather than one more `ray::RankWorker`."""
    return ray.remote(type(f"Rank({rank})", (RankWorker,), {"__module__": RankWorker.__module__}))
RayRankGroup = ray.remote(RankGroup)


def join_ray(address: str | None) -> None:
    """Join the cluster at `address` (the launcher's head, or a multi-node cluster). On loopback
    every Ray socket binds 127.0.0.1; a multi-node cluster keeps the environment it was given."""
    if address is None or address.startswith(("127.", "localhost")):
        for key, value in LOCAL_RAY_ENV.items():
            os.environ.setdefault(key, value)
    for attempt in range(JOIN_ATTEMPTS):  # a loaded machine may take a while to answer
        try:
            ray.init(
                address=address,
                include_dashboard=False,
                log_to_driver=False,
                runtime_env={
                    "env_vars": {k: os.environ[k] for k in LOCAL_RAY_ENV if k in os.environ}
                },
            )
            return
        except ConnectionError:
            if attempt == JOIN_ATTEMPTS - 1:
                raise
            time.sleep(2.0)


def spawn_instance(
    spec: InstanceSpec, cfg: Config, redis_url: str, pool_addr: str, engram: list[str]
) -> list:
    """One actor per DP rank, all in one placement group (PACK: an instance stays on one node
    where it can, as its GPUs share one NVLink domain). Mock ranks share one actor per instance
    (services/rank_group.py)."""
    if cfg.engine.kind == "mock":
        return spawn_rank_group(spec, cfg, redis_url, pool_addr)
    group = placement_group(
        [{"CPU": RANK_CPUS}] * spec.dp_ranks, strategy="PACK", name=f"rackserve-{spec.name}"
    )
    ray.get(group.ready())
    actors = []
    for r in range(spec.dp_ranks):
        strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=r)
        actors.append(
            named_rank_actor(f"{spec.name}/{r}").options(
                num_cpus=RANK_CPUS,
                scheduling_strategy=strategy,
                name=f"{spec.name}/{r}",
                max_concurrency=1,
                max_restarts=-1,  # a killed rank comes back (empty); the router migrates its work
            ).remote(cfg, spec.role, spec.name, r, redis_url, pool_addr, engram)
        )
    ray.get([a.ready.remote() for a in actors])
    return actors


def spawn_rank_group(spec: InstanceSpec, cfg: Config, redis_url: str, pool_addr: str) -> list:
    """The instance's ranks in one actor (one process), or in this process (engine.mock_ranks:
    service); a handle per rank that answers as a rank actor does."""
    if cfg.engine.mock_ranks == "service":
        local = RankGroup(cfg, spec.role, spec.name, spec.dp_ranks, redis_url, pool_addr)
        if not local.ready():
            raise RuntimeError(f"{spec.name}: mock ranks not ready")
        batcher = StepBatcher(InProcessGroup(local, spec.name))
        return [GroupedRank(batcher, r) for r in range(spec.dp_ranks)]
    group = RayRankGroup.options(
        num_cpus=RANK_CPUS,
        name=f"{spec.name}/ranks",
        max_concurrency=1,
        max_restarts=-1,  # a killed group comes back (its ranks empty); the router migrates
    ).remote(cfg, spec.role, spec.name, spec.dp_ranks, redis_url, pool_addr)
    batcher = StepBatcher(group)
    return [GroupedRank(batcher, r) for r in range(spec.dp_ranks)]


@dataclass(frozen=True)
class Pricer:
    """Prices one instance's lockstep steps with the cost model's layout for it; through `memo`
    (the simulator's step-cost memo, services/step_memo.py) when given, else exactly."""

    timing: TimingModel
    spec: InstanceSpec
    phase: str
    memo: StepMemo | None = None

    def __call__(self, batch: StepBatch) -> StepCost:
        layout = self.timing.layout(
            self.spec.layout, self.spec.gpus if self.spec.layout == "wide-ep" else None
        )
        priced = self.memo or self.timing
        if self.phase == "decode":  # per output token: MTP-aware (speculative step / accepted tokens)
            return priced.decode_token_time(layout, batch)
        return priced.step_time(self.phase, layout, batch)


def serve_metrics(cfg: Config, port: int, host: str) -> ProcessMetrics:
    metrics = ProcessMetrics(cfg.engine.model_id)
    metrics.front_door.time_scale.set(cfg.cluster.time_scale)
    start_http_server(port, addr=host, registry=metrics.registry)
    return metrics


def worker_args(role: str, argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m services.{role}")
    parser.add_argument("--config", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True, help="gRPC port")
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument(
        "--ray-address", default=None, help="join this Ray cluster (default: config)"
    )
    parser.add_argument("--redis-url", required=True, help="Redis of the KV events")
    parser.add_argument("--pool", required=True, help="KV pool service host:port")
    parser.add_argument(
        "--engram",
        nargs="*",
        default=[],
        help="Engram shard host:port list (none: each rank holds its own table)",
    )
    return parser.parse_args(argv)


@dataclass
class Worker:
    """A started worker service: its instances, their actors and lockstep loops."""

    cfg: Config
    timing: TimingModel
    specs: dict[str, InstanceSpec]  # every instance the deployment builds
    actors: dict[str, list]  # the running ones' rank handles
    metrics: ProcessMetrics
    spawn: Callable[[InstanceSpec], list]  # one instance's rank actors (the planner's start)


def start_worker(role: str, args: argparse.Namespace) -> Worker:
    cfg = load_config(args.config)
    join_ray(args.ray_address or cfg.cluster.ray_address)
    specs = {s.name: s for s in instances(cfg, role)}  # type: ignore[arg-type]
    running = running_at_start(cfg, role)  # type: ignore[arg-type]  # all, or a planner's initial ones
    actors = {s.name: spawn_instance(s, cfg, args.redis_url, args.pool, args.engram) for s in running}
    # Instances start side by side (a mock group does not wait for itself); all answer before serving
    # (ranks in this process answered as they were made).
    if not (cfg.engine.kind == "mock" and cfg.engine.mock_ranks == "service"):
        ray.get([rank.ready.remote() for ranks in actors.values() for rank in ranks])
    metrics = serve_metrics(cfg, args.metrics_port, args.host)
    for key in (key for spec in specs.values() for key in spec.ranks()):
        metrics.vllm.declare_rank(key.engine, cfg.engine.block_size, cfg.engine.cache_blocks_per_rank)
    spawn = partial(spawn_instance, cfg=cfg, redis_url=args.redis_url, pool_addr=args.pool, engram=args.engram)
    return Worker(cfg, TimingModel.from_section(cfg.timing), specs, actors, metrics, spawn)


def stop_instance(spec: InstanceSpec, ranks: list, wait_s: float = 10.0) -> None:
    """Kill an instance's rank actors (or its mock group) for good and free its placement group;
    returns once their names are free again (so a later start may reuse them)."""
    handles: list = []
    for rank in ranks:
        handle = rank.group if isinstance(rank, GroupedRank) else rank
        if all(h is not handle for h in handles):
            handles.append(handle)
    for handle in handles:
        if isinstance(handle, InProcessGroup):
            handle.close()
        else:
            ray.kill(handle, no_restart=True)
    try:
        ray.util.remove_placement_group(ray.util.get_placement_group(f"rackserve-{spec.name}"))
    except ValueError:  # mock groups have none
        pass
    names = [f"{spec.name}/{r}" for r in range(spec.dp_ranks)] + [f"{spec.name}/ranks"]
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(_named_alive(n) for n in names):
        time.sleep(0.05)


def _named_alive(name: str) -> bool:
    try:
        ray.get_actor(name)
        return True
    except ValueError:
        return False


def make_loop(worker: Worker, spec: InstanceSpec, phase: str, on_step: Callable[[StepDone], None],
              memo: StepMemo, idle: RankIdleExport) -> InstanceLoop:
    return InstanceLoop(
        spec,
        worker.actors[spec.name],
        Pricer(worker.timing, spec, phase, memo),
        worker.cfg.cluster.time_scale,
        worker.metrics,
        on_step,
        idle,
    )


async def serve_grpc(
    args: argparse.Namespace, add: Callable[[grpc.aio.Server], None], service: Any
) -> None:
    """Run the service's loops, its rank-state refresh and the gRPC server until SIGTERM/SIGINT."""
    server = grpc.aio.server(options=SERVER_OPTIONS)
    add(server)
    server.add_insecure_port(f"{args.host}:{args.port}")
    await server.start()
    for name in list(service.loops):
        service.run_loop(name)
    tasks = [asyncio.create_task(service.refresh_rank_state())]
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=0.5)
    for task in [*tasks, *service.loop_tasks.values()]:
        task.cancel()
    ray.shutdown()


async def run_worker(role: str, service_cls: Callable[[Worker], Any], add: Callable) -> None:
    """`python -m services.<role>`: join Ray, place the instances, serve gRPC (`add` is the
    generated add_*Servicer_to_server) until SIGTERM/SIGINT."""
    args = worker_args(role)
    service = service_cls(start_worker(role, args))
    await serve_grpc(args, lambda server: add(service, server), service)
