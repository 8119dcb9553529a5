"""Cost of the AgentX trace-replay source (rackserve/workload/trace_replay.py) per request, without
a simulator: lanes over data/agentx, each request "served" in 2 s + 20 ms per output token
(a stand-in clock), the source's own start/on_done time measured, reported per request and per
1,000 blocks (64-token blocks: Request.block_hashes and block_hash_array both built). The peer is
the source's first version (every request's ids mixed and converted in full), same run.

Run: .venv/bin/python bench/simulator/trace_source_cost.py [--lanes 2000] [--duration 600] [--repeats 3]
  -> bench/results/simulator/trace_source_cost.json + a printed table (medians over repeats).
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rackserve.workload import trace_replay
from rackserve.workload.spec import DEFAULT_AGENTX_TRACE, parse_workload
from rackserve.workload.trace_blocks import BlockIds, block_ids
from rackserve.workload.trace_file import read_conversations
from rackserve.workload.trace_replay import TraceReplaySource

ROOT = Path(__file__).resolve().parents[2]
SERVICE_S, PER_TOKEN_S = 2.0, 0.02  # the stand-in service time of one request


def _fresh_ids(prev, hash_ids, salt, prompt_tokens, block_tokens=64, scale=1.0, tail=0, common=None) -> BlockIds:
    """The first version: no reuse of the predecessor's ids."""
    ids = block_ids(hash_ids, salt, prompt_tokens, block_tokens, scale, tail)
    return BlockIds(hash_ids, ids, tuple(ids.tolist()))


def run_once(convs, lanes: int, duration_s: float) -> dict:
    spec = parse_workload({"kind": "agentx-trace", "concurrency": lanes, "duration_s": duration_s})
    src = TraceReplaySource(convs, spec)
    t = time.perf_counter()
    heap = [(r.arrival_s, r.req_id, r) for r in src.start()]
    source_s = time.perf_counter() - t
    heapq.heapify(heap)
    n = blocks = 0
    while heap:
        at, _, r = heapq.heappop(heap)
        n += 1
        blocks += len(r.block_hashes)
        t = time.perf_counter()
        more = src.on_done(r, at + SERVICE_S + PER_TOKEN_S * r.output_tokens)
        source_s += time.perf_counter() - t
        for q in more:
            heapq.heappush(heap, (q.arrival_s, q.req_id, q))
    return {"requests": n, "blocks_per_request": blocks / n, "source_s": source_s,
            "ms_per_request": source_s / n * 1e3, "ms_per_1000_blocks": source_s / blocks * 1e6}  # fmt: skip


def measure(convs, lanes: int, duration_s: float, repeats: int) -> dict:
    runs = [run_once(convs, lanes, duration_s) for _ in range(repeats)]
    med = {k: statistics.median(r[k] for r in runs) for k in ("ms_per_request", "ms_per_1000_blocks", "source_s")}
    return {**med, "requests": runs[0]["requests"], "blocks_per_request": runs[0]["blocks_per_request"], "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lanes", type=int, default=2000)
    ap.add_argument("--duration", type=float, default=600.0, help="simulated s")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    t = time.perf_counter()
    convs = read_conversations(DEFAULT_AGENTX_TRACE)
    load_s = time.perf_counter() - t
    ours = measure(convs, args.lanes, args.duration, args.repeats)
    incremental = trace_replay.next_block_ids
    trace_replay.next_block_ids = _fresh_ids
    try:
        first = measure(convs, args.lanes, args.duration, args.repeats)
    finally:
        trace_replay.next_block_ids = incremental
    result = {"command": f"bench/simulator/trace_source_cost.py --lanes {args.lanes} --duration {args.duration:g} "
                         f"--repeats {args.repeats}",
              "load_avg_1m": os.getloadavg()[0], "trace_read_s": load_s, "lanes": args.lanes,
              "duration_s": args.duration, "ours": ours, "first_version": first,
              "speedup": first["ms_per_request"] / ours["ms_per_request"]}  # fmt: skip
    out = ROOT / "bench" / "results" / "simulator" / "trace_source_cost.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    table = Table(title=f"trace-replay source, {args.lanes} lanes x {args.duration:g} s (medians of {args.repeats})")
    for col in ("version", "requests", "blocks/req", "ms / request", "ms / 1,000 blocks"):
        table.add_column(col, justify="right")
    for name, r in (("incremental ids", ours), ("first version", first)):
        table.add_row(name, f"{r['requests']:,}", f"{r['blocks_per_request']:,.0f}", f"{r['ms_per_request']:.3f}",
                      f"{r['ms_per_1000_blocks']:.3f}")  # fmt: skip
    Console().print(table)
    print(f"trace read {load_s:.2f} s; speedup {result['speedup']:.2f}x; load {result['load_avg_1m']:.1f}; wrote {out}")


if __name__ == "__main__":
    main()
