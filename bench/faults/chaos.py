"""Chaos run on a live cluster: per fault (a busy decode rank's Ray actor, the decode service, the
prefill service, the router, Redis, the Ray head's GCS, each killed once under a load of concurrent
greedy streams, nothing restarted by hand), how many requests were in flight at the kill,
completed (token-for-token the fault-free text), migrated, ended with a clean retryable error, or
were lost, how long until serving again and until /ready was true again; then Ctrl-C. Same code as
tests/integration/reliability/test_chaos.py (tests/integration/reliability/chaos.py).

    flock /tmp/rackserve-ray.lock .venv/bin/python bench/faults/chaos.py
writes bench/results/faults/chaos.json, prints a table and rewrites the README's failure table (the block
between `<!-- chaos:begin -->` and `<!-- chaos:end -->`) from it; `--render` only rewrites the
block from the JSON already there (tests/unit/test_readme.py checks they agree).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.integration.reliability import chaos as run  # noqa: E402

RESULT = Path(__file__).resolve().parents[1] / "results" / "faults" / "chaos.json"
README = Path(__file__).resolve().parents[2] / "README.md"
BEGIN, END = "<!-- chaos:begin (bench/faults/chaos.py) -->", "<!-- chaos:end -->"
FAULT_NAMES = {"rank_actor": "decode rank actor", "decode": "decode service",
               "prefill": "prefill service", "router": "router", "redis": "Redis",
               "ray_head": "Ray head (GCS)"}


def render(result: dict) -> str:
    """The README's failure table from a chaos.json."""
    rows = [
        "| fault | requests (in flight at the kill) | completed | migrated | clean errors (in flight "
        "at the kill) | lost | serving again | /ready true again | messages clients got |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["faults"]:
        messages = "; ".join(f"`{m}` x{n}" for m, n in r.get("error_messages", {}).items()) or "-"
        ready = r.get("ready_true_again_after_s")
        rows.append(
            f"| {FAULT_NAMES.get(r['fault'], r['fault'])} | {r['requests']} "
            f"({r.get('requests_in_flight_at_the_kill', '?')}) | {r['completed']} | "
            f"{r['migrated']} | {r['clean_errors']} ({r['clean_errors_of_requests_in_flight_at_the_kill']}) "
            f"| {r['lost']} | {r['serving_again_after_s']:.1f} s | "
            f"{'never false' if ready is None else f'{ready:.1f} s'} | {messages} |"
        )
    firsts = {r.get("first_request_when_ready_again") for r in result["faults"]} - {None}
    ctrl_c = result["ctrl_c"]
    rows.append("")
    rows.append(f"{result['clients']} greedy streaming clients, retrying every 0.2 s after a clean error; "
                "times from the kill.")
    rows.append(f"The first request sent when `/ready` was true again: {', '.join(sorted(firsts)) or '-'}. "
                f"Then Ctrl-C: exit {ctrl_c['exit_code']} in {ctrl_c['seconds']} s.")
    return "\n".join(rows)


def write_readme(result: dict, readme: Path = README) -> None:
    text = readme.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{BEGIN}\n{render(result)}\n{END}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render", action="store_true", help="only rewrite the README block")
    if parser.parse_args().render:
        write_readme(json.loads(RESULT.read_text()))
        return
    started = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="rackserve-chaos-"))
    launcher = run.start_cluster(tmp)
    try:
        reports = [r.as_dict() for r in asyncio.run(run.chaos(launcher))]
        idle = asyncio.run(run.idle_metrics(launcher.base_url))
    finally:
        code, stop_s = run.stop_with_ctrl_c(launcher)
        if launcher.proc.poll() is None:
            launcher.stop()
        shutil.rmtree(tmp, ignore_errors=True)  # the cluster's config and logs
    result = {
        "command": "flock /tmp/rackserve-ray.lock .venv/bin/python bench/faults/chaos.py",
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
    print(render(result))
    print("clean err: retryable answers (503/429, in-band error, dropped connection), clients retrying"
          " every 0.2 s while the part restarts; serving again: from the kill")
    print(f"Ctrl-C: exit {code} in {stop_s:.1f} s; wrote {RESULT}")
    write_readme(result)


if __name__ == "__main__":
    main()
