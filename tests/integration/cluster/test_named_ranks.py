"""Ranks are named (issue 34): each rank actor's process is titled by its instance and rank,
/admin/ranks gives each rank's node, PID, state and last step, and the rank's log starts with
a one-line summary, not the actor's whole Config."""

from __future__ import annotations

import glob
import tempfile
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.integration


def _ranks(base: str) -> list[dict]:
    deadline = time.monotonic() + 30  # the router learns them from the next Health round
    while True:
        ranks = httpx.get(f"{base}/admin/ranks", timeout=30).json()["ranks"]
        if all("pid" in r for r in ranks) or time.monotonic() > deadline:
            return ranks
        time.sleep(0.5)


def test_admin_ranks_name_each_ranks_process(live_cluster) -> None:
    base = live_cluster.base_url
    reply = httpx.post(f"{base}/v1/completions", timeout=60,
                       json={"model": "rackserve-moe-small", "prompt": "hi", "max_tokens": 3})
    assert reply.status_code == 200
    time.sleep(2.5)  # > the workers' 1 s state refresh and the router's 1 s Health round
    ranks = _ranks(base)
    assert ranks and all({"node", "pid", "state", "steps", "last_step_unix_s"} <= set(r) for r in ranks)
    assert any(r["steps"] > 0 and r["last_step_unix_s"] for r in ranks)
    for r in ranks:
        assert r["state"] in ("idle", "busy", "unresponsive")
        title = Path(f"/proc/{r['pid']}/cmdline").read_bytes().split(b"\0")[0].decode()
        assert f"Rank({r['instance']}/{r['rank']})" in title, title


def test_a_ranks_log_starts_with_a_one_line_summary(live_cluster) -> None:
    rank = _ranks(live_cluster.base_url)[0]
    # `rackserve up` runs Ray in a temp dir of its own (services/ray_head.py); a cluster of one's own logs
    # under Ray's default /tmp/ray
    tmp = tempfile.gettempdir()
    logs = [p for root in (f"{tmp}/rackserve-ray-*", f"{tmp}/ray")
            for p in glob.glob(f"{root}/session_*/logs/worker-*-{rank['pid']}.err")]
    assert logs, rank
    lines = Path(max(logs, key=lambda p: Path(p).stat().st_mtime)).read_text().splitlines()
    assert not any("Config(" in line for line in lines[:20])  # no 2 KB repr of the actor's args
    assert f":actor_name:{rank['instance']}/{rank['rank']}" in lines[:5]  # Ray's log prefix
    first = next(line for line in lines if not line.startswith((":job_id:", ":actor_name:")))
    assert first.startswith(f"rank {rank['instance']}/{rank['rank']} (") and len(first) < 300
