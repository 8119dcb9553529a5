"""Load and overload of the live front door: N concurrent streaming clients for a fixed duration,
at several N up to and past the admission limit.

Starts its own small cluster (`rackserve up` with a 1-prefill / 1-decode config) with a small
admission limit, so saturation is reached on a 2-core machine: past `max_in_flight + max_queued`
clients the front door must answer 429 (with Retry-After) instead of queueing without bound.
Per level: completed streams (all tokens, [DONE]), rejected (429), shed (503: queue deadline),
failed (anything else: must be 0), and the RSS of every cluster process before and after.

    .venv/bin/python bench/faults/overload.py [--levels 2 8 16 32] [--duration 10]
writes bench/results/faults/overload.json and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from services.launcher import descendants
from services.redis_server import free_port

RESULT = Path(__file__).resolve().parents[1] / "results" / "faults" / "overload.json"
MODEL = "rackserve-moe-small"
OUTPUT_TOKENS = 16
CONFIG = """\
engine: {block_size: 16, max_context: 4096, cache_blocks_per_rank: 256}
deployment:
  prefill: [{layout: dep2, count: 1}]
  decode: [{layout: wide-ep, count: 1, ranks: 2}]
engram: {shards: 1}
cluster: {prometheus: false}
"""
LIMITS = {"MAX_IN_FLIGHT": "4", "MAX_QUEUED": "8", "QUEUE_TIMEOUT_S": "30", "TIME_SCALE": "1"}


def start_cluster(config: Path, port: int) -> tuple[subprocess.Popen, dict[str, str]]:
    env = {**os.environ, **{f"RACKSERVE_CLUSTER__{k}": v for k, v in LIMITS.items()}}
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.launcher", "--config", str(config), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    urls: dict[str, str] = {}
    for line in proc.stdout:  # type: ignore[union-attr]
        parts = line.strip().rsplit(None, 1)
        if line.startswith("  ") and len(parts) == 2:
            urls[parts[0].strip()] = parts[1]
        if line.strip().startswith("logs"):
            return proc, urls
    raise RuntimeError("rackserve up exited before it was up")


def rss_mib(root: int) -> dict[str, float]:
    """Resident memory of the launcher and every process below it, by command, in MiB."""
    out: dict[str, float] = {}
    for pid in [root, *descendants(root)]:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        kb = next((int(s.split()[1]) for s in status.splitlines() if s.startswith("VmRSS")), 0)
        name = " ".join(c.decode(errors="replace") for c in cmd[:3] if c)[-60:]
        out[f"{pid} {name}"] = round(kb / 1024, 1)
    return out


async def client_loop(client: httpx.AsyncClient, base: str, cid: int, until: float, tally: dict):
    i = 0
    while time.monotonic() < until:
        body = {
            "model": MODEL,
            "prompt": f"client {cid} request {i}: the rack twin under load",
            "max_tokens": OUTPUT_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        i += 1
        try:
            async with client.stream("POST", f"{base}/v1/completions", json=body) as reply:
                if reply.status_code == 429:
                    tally["rejected_429"] += 1
                    await reply.aread()
                    await asyncio.sleep(float(reply.headers.get("retry-after", "1")))
                    continue
                if reply.status_code == 503:
                    tally["shed_503"] += 1
                    await reply.aread()
                    continue
                chunks, done = 0, False
                async for line in reply.aiter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: ") and '"error"' in line:
                        break
                    elif line.startswith("data: {"):
                        chunks += 1
                ok = reply.status_code == 200 and done and chunks >= OUTPUT_TOKENS
                tally["completed" if ok else "failed"] += 1
        except httpx.HTTPError:
            tally["failed"] += 1


async def level(base: str, clients: int, duration: float) -> dict:
    tally = {"completed": 0, "rejected_429": 0, "shed_503": 0, "failed": 0}
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        until = time.monotonic() + duration
        started = time.monotonic()
        await asyncio.gather(*(client_loop(client, base, c, until, tally) for c in range(clients)))
        wall = time.monotonic() - started
    return {
        "clients": clients,
        **tally,
        "wall_s": round(wall, 2),
        "completed_per_s": round(tally["completed"] / wall, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[2, 8, 16, 32])
    parser.add_argument("--duration", type=float, default=10.0)
    args = parser.parse_args()
    config = Path(tempfile.mkdtemp(prefix="rackserve-load-")) / "load.yaml"
    config.write_text(CONFIG)
    proc, urls = start_cluster(config, free_port())
    base = urls["OpenAI API"].removesuffix("/v1")
    try:
        rss_start = rss_mib(proc.pid)
        results = []
        for n in args.levels:
            before = rss_mib(proc.pid)
            result = asyncio.run(level(base, n, args.duration))
            after = rss_mib(proc.pid)
            result["rss_total_mib_before"] = round(sum(before.values()), 1)
            result["rss_total_mib_after"] = round(sum(after.values()), 1)
            results.append(result)
            print(json.dumps(result), flush=True)
        rss_end = rss_mib(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    report = {
        "command": "python bench/faults/overload.py " + " ".join(sys.argv[1:]),
        "host": {
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "load_avg_at_end": os.getloadavg(),
        },
        "config": CONFIG,
        "limits": LIMITS,
        "output_tokens": OUTPUT_TOKENS,
        "duration_s": args.duration,
        "levels": results,
        "rss_mib_start": rss_start,
        "rss_mib_end": rss_end,
        "note": "failed must be 0; 429 appears once clients exceed max_in_flight + max_queued",
    }
    RESULT.write_text(json.dumps(report, indent=2) + "\n")
    head = f"{'clients':>8} {'completed':>10} {'429':>6} {'503':>6} {'failed':>7} {'req/s':>7} {'RSS MiB before->after':>24}"
    print(head)
    for r in results:
        rss = f"{r['rss_total_mib_before']}->{r['rss_total_mib_after']}"
        print(
            f"{r['clients']:>8} {r['completed']:>10} {r['rejected_429']:>6} {r['shed_503']:>6} "
            f"{r['failed']:>7} {r['completed_per_s']:>7} {rss:>24}"
        )


if __name__ == "__main__":
    main()
