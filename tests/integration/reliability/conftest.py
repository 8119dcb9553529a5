"""A small private cluster for reliability tests (they kill, drain and overload it), with an API
key and a tiny admission limit set through the config's env overrides. Module-scoped: each test
module gets a fresh one and the session cluster is never touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.redis_server import RedisServer, free_port
from tests.e2e.launcher_proc import LauncherProcess, launcher_command

API_KEY = "sk-reliability-7f3a9c0e51"
TINY = """\
engine: {block_size: 16, max_context: 4096, cache_blocks_per_rank: 256}
deployment:
  prefill: [{layout: dep2, count: 1}]
  decode: [{layout: wide-ep, count: 1, ranks: 2}]
engram: {shards: 1}
cluster: {prometheus: false}
"""


TWO_DECODE = TINY.replace("count: 1, ranks: 2", "count: 2, ranks: 2")


def start_small_cluster(tmp: Path, yaml: str = TINY, **cluster: str) -> LauncherProcess:
    config = tmp / "tiny.yaml"
    config.write_text(yaml)
    env = {f"RACKSERVE_CLUSTER__{k.upper()}": v for k, v in cluster.items()}
    proc = LauncherProcess(
        launcher_command("--config", str(config), "--port", str(free_port())), env=env
    )
    return proc.start(timeout_s=240)


@pytest.fixture(scope="module")
def guarded_cluster(tmp_path_factory):
    """API key required; 1 request served at a time, 1 queued, 2 s queue deadline; pacing 20 wall s per sim s
    so a long stream holds its slot for seconds."""
    proc = start_small_cluster(
        tmp_path_factory.mktemp("guarded"),
        api_key=API_KEY,
        max_in_flight="1",
        max_queued="1",
        queue_timeout_s="2",
        time_scale="20",
    )
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def fault_cluster(tmp_path_factory):
    """Two 2-rank Wide-EP decode instances (somewhere to migrate to); 5 wall s per sim s so a
    300-token stream lasts a few seconds; a hung prefill call times out after 8 s, a decode stream silent for 5 s migrates; an external Redis (`.redis`) the tests may restart."""
    redis = RedisServer().start()  # the test's own, so it can restart it empty
    proc = start_small_cluster(
        tmp_path_factory.mktemp("fault"),
        TWO_DECODE,
        time_scale="5",
        redis_url=redis.url,
        worker_timeout_s="8",
        decode_chunk_timeout_s="5",
    )
    proc.redis = redis
    yield proc
    proc.stop()
    redis.stop()
