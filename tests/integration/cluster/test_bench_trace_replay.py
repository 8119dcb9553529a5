"""`rackserve bench --trace` on the recorded AgentX conversations against the live cluster: two
lanes replay (warm-up first), prompts follow the trace's hash ids, so the engine really reuses
cached prefixes; the small model's context comes from /v1/models and the lengths are fitted to it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rackserve.workload.spec import DEFAULT_AGENTX_TRACE
from tests.conftest import CLUSTER_TIME_SCALE

ROOT = Path(__file__).resolve().parents[3]
WALL_S = 20.0  # about this long of load


def test_bench_replays_agentx_lanes_with_real_prefix_hits(live_cluster, tmp_path):
    duration_sim_s = WALL_S / float(CLUSTER_TIME_SCALE)
    cmd = [sys.executable, "-m", "services.bench", "--url", live_cluster.base_url, "--trace", DEFAULT_AGENTX_TRACE,
           "--concurrency", "2", "--duration", f"{duration_sim_s:.0f}", "--no-progress", "--save-result",
           "--result-dir", str(tmp_path), "--result-filename", "r.json"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    print(proc.stderr[-2000:], proc.stdout)  # the summary table, shown with -s
    assert proc.returncode == 0, proc.stdout + proc.stderr
    err = " ".join(proc.stderr.split())  # a console may wrap a long path's line
    assert "length scale" in err and "4,096-token context" in err  # fitted to /v1/models
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["warmup_requests"] == 2 and r["failed"] == 0 and r["valid"]
    assert r["completed"] >= 2, proc.stdout
    assert r["total_cached_input_tokens"] > 0 and r["cached_token_share"] > 0.3  # real engine prefix hits
    assert max(r["input_lens"]) <= 4096


def test_agentx_sessions_too_long_for_the_model_are_refused_before_sending(live_cluster):
    """The old failure: 10.8k-token prompts on a 4,096-token model, 105 HTTP 400s and a table of zeros."""
    cmd = [sys.executable, "-m", "services.bench", "--url", live_cluster.base_url, "--agentx",
           "--concurrency", "8", "--duration", "30", "--no-progress"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    err = " ".join(proc.stderr.split())
    assert "first prompt is 10,800 tokens" in err and "4,096-token context" in err
    assert "Serving Benchmark Result" not in proc.stdout
