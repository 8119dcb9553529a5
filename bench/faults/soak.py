"""Soak: a steady load of streaming clients on the live front door for >= 10 minutes, sampling
every cluster process's RSS each minute (a leak shows as growth across samples).

Same small cluster and admission limits as bench/faults/overload.py, at a concurrency past the slot count
(so the queue is in use) but below the 429 point, unless --clients says otherwise.

    .venv/bin/python bench/faults/soak.py [--minutes 10] [--clients 8]
writes bench/results/faults/soak.json and prints one line per minute.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from overload import CONFIG, LIMITS, level, rss_mib, start_cluster  # noqa: E402

from services.redis_server import free_port  # noqa: E402

RESULT = Path(__file__).resolve().parents[1] / "results" / "faults" / "soak.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=10)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    config = Path(tempfile.mkdtemp(prefix="rackserve-soak-")) / "soak.yaml"
    config.write_text(CONFIG)
    proc, urls = start_cluster(config, free_port())
    base = urls["OpenAI API"].removesuffix("/v1")
    minutes = []
    try:
        rss_start = rss_mib(proc.pid)
        for minute in range(args.minutes):
            result = asyncio.run(level(base, args.clients, 60.0))
            result["minute"] = minute + 1
            result["rss_total_mib"] = round(sum(rss_mib(proc.pid).values()), 1)
            minutes.append(result)
            print(json.dumps(result), flush=True)
        rss_end = rss_mib(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    totals = {
        k: sum(m[k] for m in minutes) for k in ("completed", "rejected_429", "shed_503", "failed")
    }
    report = {
        "command": "python bench/faults/soak.py " + " ".join(sys.argv[1:]),
        "host": {"cpus": os.cpu_count(), "load_avg_at_end": os.getloadavg()},
        "limits": LIMITS,
        "clients": args.clients,
        "totals": totals,
        "rss_total_mib_start": round(sum(rss_start.values()), 1),
        "rss_total_mib_end": round(sum(rss_end.values()), 1),
        "minutes": minutes,
        "rss_mib_start": rss_start,
        "rss_mib_end": rss_end,
        "finished_at_unix": time.time(),
    }
    RESULT.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(totals))


if __name__ == "__main__":
    main()
