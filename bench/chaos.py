"""Chaos run on a live cluster: per fault (a decode rank's Ray actor, the decode service, the
prefill service, the router, Redis, each killed once under a load of concurrent greedy streams,
nothing restarted by hand), how many requests completed (token-for-token the fault-free text),
migrated, ended with a clean retryable error, or were lost; then Ctrl-C. Same code as
tests/integration/reliability/test_chaos.py (tests/integration/reliability/chaos.py).

    flock /tmp/rackserve-ray.lock .venv/bin/python bench/chaos.py
writes bench/results/chaos.json and prints a table.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.integration.reliability import chaos as run  # noqa: E402

RESULT = Path(__file__).parent / "results" / "chaos.json"


def main() -> None:
    started = time.time()
    launcher = run.start_cluster(Path(tempfile.mkdtemp(prefix="rackserve-chaos-")))
    try:
        reports = [r.as_dict() for r in asyncio.run(run.chaos(launcher))]
        idle = asyncio.run(run.idle_metrics(launcher.base_url))
    finally:
        code, stop_s = run.stop_with_ctrl_c(launcher)
        if launcher.proc.poll() is None:
            launcher.stop()
    result = {
        "command": "flock /tmp/rackserve-ray.lock .venv/bin/python bench/chaos.py",
        "machine": {"cpus": os.cpu_count(), "load_1m": os.getloadavg()[0], "python": platform.python_version()},
        "config": run.CONFIG,
        "clients": run.CLIENTS,
        "max_tokens": run.MAX_TOKENS,
        "faults": reports,
        "idle_metrics_after": idle,
        "ctrl_c": {"exit_code": code, "seconds": round(stop_s, 2)},
        "wall_s": round(time.time() - started, 1),
    }
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'fault':12s} {'requests':>8s} {'completed':>9s} {'migrated':>8s} {'clean err':>9s} "
          f"{'(in flight)':>11s} {'lost':>4s} {'serving again':>13s}")
    for r in reports:
        print(f"{r['fault']:12s} {r['requests']:8d} {r['completed']:9d} {r['migrated']:8d} "
              f"{r['clean_errors']:9d} {r['clean_errors_of_requests_in_flight_at_the_kill']:11d} "
              f"{r['lost']:4d} {r['serving_again_after_s']:12.1f}s")
    print("clean err: retryable answers (503/429, in-band error, dropped connection), clients retrying"
          " every 0.2 s while the part restarts; serving again: from the kill")
    print(f"Ctrl-C: exit {code} in {stop_s:.1f} s; wrote {RESULT}")


if __name__ == "__main__":
    main()
