"""The live pool service under pool.scope deployment (issue 50): its tiers are the store the
deployment configures (each host's segment, the spare HBM lent), not the rack-wide defaults, and a
working set larger than that store is evicted LRU in the real service on the real Redis."""

from __future__ import annotations

import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from services.kvpool.client import PoolClient
from services.kvpool.spawn import PoolProcess

ROOT = Path(__file__).resolve().parents[3]
BLOCK_TARGET_BYTES = 16 * 890  # local.yaml's 16-token blocks x DeepSeek-V4.1-Flash's 890 KV bytes per token
HOSTS = 4  # local.yaml: DEP2 on one tray; Wide-EP 4 on one, TP8 on two


def test_the_pool_holds_the_configured_store_and_evicts_past_it(redis_server, tmp_path):
    config = yaml.safe_load((ROOT / "scenarios" / "local.yaml").read_text())
    segment = 5 * BLOCK_TARGET_BYTES  # five blocks per host: 20 in the store
    config["pool"] = {"scope": "deployment", "segment_bytes_per_host": segment}
    path = tmp_path / "deployment.yaml"
    path.write_text(yaml.safe_dump(config))
    tag = uuid.uuid4().hex[:8]
    pool = PoolProcess(redis_server, ("--config", str(path), "--key-prefix", f"test:{tag}:kv:",
                                      "--event-stream", f"test:{tag}:ev"))
    with pool, PoolClient(pool.address, owner="writer") as client:
        for h in range(1, 41):  # 40 one-block chains: twice what the store holds
            assert client.put([h], [b"x" * 100]).ok
        stats = client.stats()
        hbm, dram = stats.tiers  # pool_hbm, pool_dram
        assert dram.capacity_bytes == HOSTS * segment and hbm.capacity_bytes == 0
        assert dram.evictions > 0 and dram.keys < 20
        assert client.match_prefix([1]).count == 0 and client.match_prefix([40]).count == 1  # LRU: the oldest went
        text = urllib.request.urlopen(f"http://{pool.metrics_address}/metrics", timeout=5).read().decode()
    capacity = {s.labels["tier"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "rackserve_pool_capacity_bytes"}
    assert capacity["pool_dram"] == pytest.approx(HOSTS * segment)
