"""`python -m services.kvpool --redis-url URL --port P --metrics-port M [--config FILE]`

Runs the KV pool service until SIGTERM/SIGINT. Prints one line when ready:
  KVPOOL READY grpc=127.0.0.1:P metrics=127.0.0.1:M redis=URL
Port 0 picks a free port (the line says which). Without --redis-url (and no cluster.redis_url in
the config) it starts an embedded Redis of its own and stops it on exit.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from dataclasses import replace

from rackserve.config import Config, load_config
from rackserve.kv.pool_tiers import PoolLimits
from rackserve.sim.sizing import store_capacity
from rackserve.timing.spec import load_model
from services.kvevents import STREAM
from services.kvpool.keys import DEFAULT_PREFIX
from services.kvpool.metrics import serve_metrics
from services.kvpool.server import PoolOptions, PoolServer
from services.redis_server import RedisServer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m services.kvpool", description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=None, help="Redis holding the bytes (default: config or embedded)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="gRPC port (0 = free port)")
    parser.add_argument("--metrics-port", type=int, default=0, help="Prometheus /metrics port (0 = free port)")
    parser.add_argument("--config", default=None, help="rackserve YAML config (pool section)")
    parser.add_argument("--key-prefix", default=DEFAULT_PREFIX, help="Redis key prefix of block bytes")
    parser.add_argument("--event-stream", default=STREAM, help="Redis Stream of KV events")
    return parser.parse_args(argv)


def target_block_bytes(config: Config) -> int:
    """What one small-model block weighs in the emulated rack: its tokens x the target model's KV
    bytes per token (timing.model's spec), so tier capacities count target bytes."""
    return int(config.engine.block_size * load_model(config.timing.model).kv_bytes_per_token)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s kvpool %(levelname)s %(message)s")
    try:
        config = load_config(args.config)
    except (OSError, ValueError) as exc:
        print(f"kvpool: {exc}", file=sys.stderr)
        return 2
    redis_url = args.redis_url or config.cluster.redis_url
    embedded = None if redis_url else RedisServer().start()
    redis_url = redis_url or embedded.url  # type: ignore[union-attr]
    limits = PoolLimits.from_config(config.pool, target_block_bytes(config))
    if config.pool.scope == "deployment":  # the store over the deployment's hosts (rackserve/sim/pool_scope.py)
        hbm, dram = store_capacity(config)
        limits = replace(limits, hbm_capacity_bytes=hbm, dram_capacity_bytes=dram)
    server = PoolServer(limits, PoolOptions(redis_url, args.key_prefix, args.event_stream),
                        host=args.host, port=args.port).start()
    metrics, metrics_port = serve_metrics(server.servicer, args.metrics_port, args.host)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"KVPOOL READY grpc={server.address} metrics={args.host}:{metrics_port} redis={redis_url}", flush=True)
    stop.wait()
    server.stop()
    metrics.shutdown()  # type: ignore[attr-defined]
    if embedded is not None:
        embedded.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
