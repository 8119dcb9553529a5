"""Why the simulator's KV bookkeeping costs what it does at rack scale: the CPU time of one key's LRU
operation (OrderedDict.move_to_end, the pool tiers' and rank caches' touch; dict membership, the pool's
`is_known`) on tables of growing size, for chains of 110 keys (an AgentX prompt of ~113k tokens in
1,024-token groups). Past the CPU caches each key costs a few memory round trips, whatever the code
around it: this is the floor of a per-key data model (bench/results/simulator/frontier_point.md's KV parts).

Run: .venv/bin/python bench/simulator/lru_key_cost.py -> bench/results/simulator/lru_key_cost.json and a table.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import OrderedDict, deque
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[2]
CHAIN = 110
CHAINS = 2000


def measure(size: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    od: OrderedDict[int, None] = OrderedDict((rng.getrandbits(63), None) for _ in range(size))
    plain = dict(od)
    keys = list(od)
    chains = [rng.sample(keys, CHAIN) for _ in range(CHAINS)]
    t = time.process_time()
    for c in chains:
        deque(map(od.move_to_end, reversed(c)), maxlen=0)
    move = time.process_time() - t
    t = time.process_time()
    for c in chains:
        deque(map(plain.__contains__, c), maxlen=0)
    contains = time.process_time() - t
    n = CHAINS * CHAIN
    return {"entries": size, "move_to_end_ns_per_key": 1e9 * move / n, "contains_ns_per_key": 1e9 * contains / n}


def main() -> None:
    rows = [measure(size) for size in (10_000, 100_000, 1_000_000, 4_000_000)]
    out = {"command": "python bench/simulator/lru_key_cost.py", "chain_keys": CHAIN, "chains": CHAINS,
           "load_average_1m": os.getloadavg()[0], "rows": rows}
    path = ROOT / "bench" / "results" / "simulator" / "lru_key_cost.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    table = Table(title="CPU ns per key, chains of 110 random keys")
    for col in ("entries", "OrderedDict.move_to_end", "dict membership"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(f"{r['entries']:,}", f"{r['move_to_end_ns_per_key']:.0f}", f"{r['contains_ns_per_key']:.0f}")
    Console().print(table)


if __name__ == "__main__":
    main()
