"""Engram batched lookup latency over N shard processes, next to the in-process table.

Cases: 4,096 random row ids (the issue's figure) and the rows of 4,096 tokens (x H heads), for
both tables; each lookup fans out to every shard in parallel and is checked bitwise against
`LocalEngramTable` once.

    .venv/bin/python bench/engine/engram_lookup.py [--shards 4] [--iters 200]
writes bench/results/engine/engram_lookup.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from rackserve.model.config import ModelConfig
from rackserve.model.engram import LocalEngramTable
from services.engram.client import ShardedEngramTable
from services.engram.spawn import ShardProcesses

RESULT = Path(__file__).resolve().parents[1] / "results" / "engine" / "engram_lookup.json"


def latency(fn, iters: int, warmup: int = 10) -> dict[str, float]:
    seconds = []
    for i in range(iters + warmup):
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            seconds.append(time.perf_counter() - t0)
    ms = np.array(seconds) * 1e3
    return {"median_ms": float(np.median(ms)), "p99_ms": float(np.percentile(ms, 99)), "iters": iters}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    load_start = os.getloadavg()[0]  # other work on the machine: the figures are only as quiet as this
    cfg = ModelConfig()
    local = LocalEngramTable(cfg)
    rng = np.random.default_rng(0)
    cases = {"4096 rows": rng.integers(0, cfg.engram_rows, size=4096),
             f"4096 tokens x {cfg.engram_heads} heads": rng.integers(0, cfg.engram_rows, size=(4096, cfg.engram_heads))}
    rows = []
    with ShardProcesses(args.shards) as procs, ShardedEngramTable(procs.addresses, cfg) as table:
        for name, ids in cases.items():
            assert table.lookup(0, ids).tobytes() == local.lookup(0, ids).tobytes(), "sharded != local"
            rows.append({"case": name, "rows": int(ids.size), "shards": args.shards,
                         "sharded": latency(lambda ids=ids: table.lookup(0, ids), args.iters),
                         "in_process": latency(lambda ids=ids: local.lookup(0, ids), args.iters)})
    result = {"command": f"python bench/engine/engram_lookup.py --shards {args.shards} --iters {args.iters}",
              "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
              "table_rows": cfg.engram_rows, "dim": cfg.engram_dim, "cases": rows,
              "load_avg_1m_start_end": [load_start, os.getloadavg()[0]]}
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'case':>24} {'rows':>6} {'sharded median ms':>18} {'p99 ms':>8} {'in-process median ms':>21} {'p99 ms':>8}")
    for r in rows:
        s, p = r["sharded"], r["in_process"]
        print(f"{r['case']:>24} {r['rows']:>6} {s['median_ms']:>18.3f} {s['p99_ms']:>8.3f} "
              f"{p['median_ms']:>21.3f} {p['p99_ms']:>8.3f}")
    print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
