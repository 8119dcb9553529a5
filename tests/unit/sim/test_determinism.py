"""Determinism as a gate: two fresh processes, with different string-hash seeds, give byte-identical result
JSON on a Mooncake window and an AgentX window (the golden scenarios of test_sim_golden.py, both policies,
every TTFT sample). Only the run's own speed (wall_s, cpu_s) is left out: it measures the machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
RUN = """
import json, sys
from rackserve.sim.run import run_policies
from tests.unit.sim.test_sim_golden import POLICIES, scenario
results = [r.to_dict(samples=True) for r in run_policies(scenario(sys.argv[1]), POLICIES)]
for r in results:
    r.pop("wall_s"), r.pop("cpu_s")
sys.stdout.write(json.dumps(results, indent=1))
"""


def result_json(name: str, hash_seed: int) -> bytes:
    env = {k: v for k, v in os.environ.items() if k != "RACKSERVE_STEP_STORE"}
    env.update(PYTHONHASHSEED=str(hash_seed), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", RUN, name], cwd=ROOT, env=env, capture_output=True, check=True,
                          timeout=600).stdout


@pytest.mark.parametrize("name", ["mooncake", "agentx"])
def test_two_fresh_processes_give_byte_identical_results(name):
    first, second = result_json(name, 1), result_json(name, 2)
    assert b'"ttft_samples"' in first and len(first) > 10_000
    assert first == second
