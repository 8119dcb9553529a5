"""`python -m services.engram --shard I --shards N --port P [--config FILE]`

Runs one Engram shard (rows [I*R/N, (I+1)*R/N) of both tables, R = engram.table_rows, values
from engine.seed) until SIGTERM/SIGINT. Prints one line when ready:
  ENGRAM READY shard=I shards=N grpc=127.0.0.1:P rows=START:STOP
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from rackserve.config import load_config
from rackserve.model.config import ModelConfig
from services.engram.shard import ShardServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.engram", description=__doc__.splitlines()[0])
    parser.add_argument("--shard", type=int, required=True)
    parser.add_argument("--shards", type=int, default=None, help="default: engram.shards of the config")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="gRPC port (0 = free port)")
    parser.add_argument("--config", default=None, help="rackserve YAML config (engine, engram sections)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        shards = args.shards or config.engram.shards
        cfg = ModelConfig.from_sections(config.engine, config.engram)
        server = ShardServer(cfg, args.shard, shards, args.host, args.port).start()
    except (OSError, ValueError) as exc:
        print(f"engram: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    s = server.servicer
    print(f"ENGRAM READY shard={args.shard} shards={shards} grpc={server.address} rows={s.start}:{s.stop}", flush=True)
    stop.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
