"""The simulator's KV work alone, old vs new: record every ClusterKV call (delivered_hit, store, and
the clock) of one AgentX run, then replay the calls on ClusterKV in fresh subprocesses, alternating
between this tree and an older one, and compare CPU seconds. The replay is deterministic, so the
same calls make the same KV state digest on both trees (checked); `--shrink K` divides every rank
cache and pool tier by K, so the replay evicts as the 10,000-lane run does.

Run: .venv/bin/python bench/simulator/kv_replay.py record [--lanes 1000] [--minutes 2] [--out /tmp/kvcalls.pkl]
     .venv/bin/python bench/simulator/kv_replay.py compare --baseline DIR [--calls /tmp/kvcalls.pkl] [--rounds 3] [--shrink 1,20]
     -> bench/results/simulator/kv_replay.json and a printed table (median CPU s per side and their ratio).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def record(args) -> None:
    from rackserve.sim import kv as simkv
    from rackserve.sim.run import source_factory, timing_for
    from rackserve.sim.scenario import load_scenario
    from rackserve.sim.simulator import Simulator

    calls: list = []
    init: dict = {}
    real_init, real_hit, real_store = simkv.ClusterKV.__init__, simkv.ClusterKV.delivered_hit, simkv.ClusterKV.store

    def _init(self, cache_blocks, pool, block_tokens, block_bytes, index, paths=None):
        init.update(cache_blocks=dict(cache_blocks), pool=pool, block_tokens=block_tokens,
                    block_bytes=block_bytes, paths=pickle.dumps(paths))
        real_init(self, cache_blocks, pool, block_tokens, block_bytes, index, paths)

    def _hit(self, rank, keys, prompt_tokens, now):
        calls.append(("hit", rank, keys, prompt_tokens, now))
        return real_hit(self, rank, keys, prompt_tokens, now)

    def _store(self, rank, keys, delivered, now):
        calls.append(("store", rank, keys, delivered, now))
        return real_store(self, rank, keys, delivered, now)

    simkv.ClusterKV.__init__, simkv.ClusterKV.delivered_hit, simkv.ClusterKV.store = _init, _hit, _store
    sc = load_scenario(ROOT / "scenarios" / "nvl72-vr200.yaml")
    sc = sc.with_workload(sc.workload.model_copy(update={"concurrency": args.lanes, "duration_s": args.minutes * 60,
                                                          "measure_start_s": 0.0, "measure_s": None,
                                                          "warmup_first": False}))
    Simulator(sc, timing_for(sc), "least-uncached-work", source_factory(sc)()).run()
    # BlockKeys as plain tuples (pickle-stable across trees); one shared copy per request's keys
    plain = [(c[0], c[1], (c[2].keys, tuple(c[2].blocks), c[2].group), c[3], c[4]) for c in calls]
    with open(args.out, "wb") as f:
        pickle.dump({"init": init, "calls": plain}, f, protocol=pickle.HIGHEST_PROTOCOL)
    print(f"{len(calls)} calls -> {args.out}")


def replay(calls_path: str, shrink: int) -> dict:
    """Replay in this process (the tree on sys.path): CPU seconds of the calls and a state digest."""
    from rackserve.routing.index import PrefixIndex
    from rackserve.sim.block_keys import BlockKeys
    from rackserve.sim.kv import ClusterKV, pool_limits

    with open(calls_path, "rb") as f:
        data = pickle.load(f)
    init, memo = data["init"], {}
    calls = []
    for kind, rank, (keys, blocks, group), n, now in data["calls"]:
        k = memo.get(keys)
        if k is None:
            k = memo[keys] = BlockKeys(keys, blocks, group)
        calls.append((kind, rank, k, n, now))
    p = init["pool"]
    pool = pool_limits(p.hbm_capacity_bytes // shrink, p.dram_capacity_bytes // shrink, p.high_watermark,
                       p.low_watermark)
    try:
        index = PrefixIndex(closed_chains=True)
    except TypeError:  # a tree from before closed_chains
        index = PrefixIndex()
    caches = {r: max(1, n // shrink) for r, n in init["cache_blocks"].items()}
    kv = ClusterKV(caches, pool, init["block_tokens"], init["block_bytes"], index, pickle.loads(init["paths"]))
    hit, store = kv.delivered_hit, kv.store
    cpu = time.process_time()
    out = [hit(r, k, n, t) if kind == "hit" else store(r, k, n, t) for kind, r, k, n, t in calls]
    cpu = time.process_time() - cpu
    digest = hashlib.sha256(repr((out, kv.recomputed_tokens, kv.evictions(), _holders(kv),
                                  kv.pool.lru_order("pool_hbm"), kv.pool.lru_order("pool_dram"))).encode()).hexdigest()
    return {"cpu_s": cpu, "calls": len(calls), "digest": digest[:16], "evictions": kv.evictions()}


def _holders(kv) -> list:
    """Every holder's blocks as the caches and the pool hold them (what the router's index answers
    from: a tree whose index still copies them holds the same blocks there): each rank's LRU order
    and each pool tier's blocks sorted (the tiers' LRU orders are in the digest beside this)."""
    ranks = [((r[0], r[1], "rank_hbm"), list(c.lru)) for r, c in kv.caches.items() if len(c)]
    return sorted(ranks) + [(t, sorted(kv.pool.lru_order(t))) for t in ("pool_hbm", "pool_dram")]


def compare(args) -> None:
    sides = {"new": str(ROOT), "old": str(Path(args.baseline).resolve())}
    rows = []
    for shrink in map(int, args.shrink.split(",")):
        runs: dict[str, list[dict]] = {"old": [], "new": []}
        for _ in range(args.rounds):
            for side in ("old", "new"):
                env = {**os.environ, "PYTHONPATH": sides[side]}
                res = subprocess.run([sys.executable, __file__, "_replay", args.calls, str(shrink)], env=env,
                                     capture_output=True, text=True, check=True)
                runs[side].append(json.loads(res.stdout.strip().splitlines()[-1]))
        old, new = (statistics.median(r["cpu_s"] for r in runs[s]) for s in ("old", "new"))
        digests = {s: {r["digest"] for r in runs[s]} for s in runs}
        rows.append({"shrink": shrink, "calls": runs["new"][0]["calls"], "old_cpu_s": old, "new_cpu_s": new,
                     "ratio": new / old, "old_runs": [r["cpu_s"] for r in runs["old"]],
                     "new_runs": [r["cpu_s"] for r in runs["new"]], "evictions": runs["new"][0]["evictions"],
                     "same_state": digests["old"] == digests["new"] and len(digests["new"]) == 1})
        print(json.dumps(rows[-1]))
    out = {"command": " ".join(["bench/simulator/kv_replay.py", *sys.argv[1:]]), "baseline": args.baseline,
           "load_avg_1m": os.getloadavg()[0], "rows": rows}
    args.out.write_text(json.dumps(out, indent=2) + "\n")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_replay":
        print(json.dumps(replay(sys.argv[2], int(sys.argv[3]))))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--lanes", type=int, default=1000)
    rec.add_argument("--minutes", type=float, default=2.0)
    rec.add_argument("--out", default="/tmp/kvcalls.pkl")
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("--baseline", required=True)
    cmp_.add_argument("--calls", default="/tmp/kvcalls.pkl")
    cmp_.add_argument("--rounds", type=int, default=3)
    cmp_.add_argument("--shrink", default="1,20")
    cmp_.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "simulator" / "kv_replay.json")
    args = ap.parse_args()
    {"record": record, "compare": compare}[args.cmd](args)


if __name__ == "__main__":
    main()
