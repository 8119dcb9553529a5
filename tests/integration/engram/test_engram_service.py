"""Engram over 4 real shard processes equals the single in-process table, bitwise."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from rackserve.model.config import ModelConfig
from rackserve.model.engine import Engine
from rackserve.model.engram import LocalEngramTable, engram_row_ids
from rackserve.model.sampling import SamplingParams
from services._proto import engram_pb2 as pb
from services._proto import engram_pb2_grpc as pb_grpc
from services.engram.client import ShardedEngramTable
from services.engram.shard import shard_range
from services.engram.spawn import ShardProcesses

pytestmark = pytest.mark.integration
CFG = ModelConfig()  # the defaults of rackserve.config (engine.seed 0, engram.table_rows 65536)


@pytest.fixture(scope="module")
def shards():
    with ShardProcesses(4) as procs:
        yield procs


@pytest.fixture(scope="module")
def sharded(shards):
    with ShardedEngramTable(list(reversed(shards.addresses)), CFG) as table:  # any address order
        yield table


@pytest.fixture(scope="module")
def local():
    return LocalEngramTable(CFG)


def test_sharded_lookup_equals_single_table_bitwise(sharded, local):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, CFG.engram_rows, size=(3, 50, CFG.engram_heads))
    bounds = [shard_range(i, 4, CFG.engram_rows) for i in range(4)]
    ids[0, 0, :] = [b for r in bounds for b in (r[0], r[1] - 1)][: CFG.engram_heads]  # shard edges
    ids[1] = ids[0]  # duplicates across the batch
    for table in (0, 1):
        got = sharded.lookup(table, ids)
        want = local.lookup(table, ids)
        assert got.shape == (3, 50, CFG.engram_heads, CFG.engram_dim) and got.dtype == np.float32
        assert got.tobytes() == want.tobytes()
    assert not np.array_equal(sharded.lookup(0, ids), sharded.lookup(1, ids))


def test_lookup_all_is_both_tables_in_one_round_bitwise(sharded, local):
    ids = np.random.default_rng(2).integers(0, CFG.engram_rows, size=(40, CFG.engram_heads))
    got, want = sharded.lookup_all(ids), local.lookup_all(ids)
    assert len(got) == len(want) == 2
    for table in (0, 1):
        assert got[table].tobytes() == want[table].tobytes() == local.lookup(table, ids).tobytes()


def test_cached_rows_are_the_shards_rows_and_skip_the_shards(shards, local):
    ids = np.random.default_rng(3).integers(0, CFG.engram_rows, size=(30, CFG.engram_heads))
    with ShardedEngramTable(shards.addresses, CFG, cache_rows=CFG.engram_rows) as cached:
        calls = []
        cached._call = lambda *a, call=cached._call: calls.append(a) or call(*a)
        for _ in range(2):  # the second lookup finds every row cached: no shard is called
            got = cached.lookup_all(ids)
            for table in (0, 1):
                assert got[table].tobytes() == local.lookup(table, ids).tobytes()
            assert len(calls) == 4  # the first lookup: one call per shard for both tables
        fresh = np.append(ids[0], (ids.max() + 1) % CFG.engram_rows)  # one new id: one call
        assert cached.lookup(0, fresh).tobytes() == local.lookup(0, fresh).tobytes()
        assert len(calls) == 5


def test_row_ids_from_tokens_and_prefetch(sharded, local):
    tokens = np.random.default_rng(1).integers(0, CFG.vocab_size, size=200)
    rows = sharded.row_ids(tokens)
    assert np.array_equal(rows, engram_row_ids(tokens, CFG))
    future = sharded.prefetch(1, rows)
    assert future.result(timeout=10).tobytes() == local.lookup(1, rows).tobytes()


def test_model_outputs_match_with_sharded_and_local_tables(sharded):
    prompt = list(np.random.default_rng(2).integers(0, 256, size=40))
    params = SamplingParams(max_tokens=6, temperature=0.0)
    remote = Engine.from_config(CFG, engram=sharded, num_blocks=64).generate([("r", prompt, params)])
    inproc = Engine.from_config(CFG, num_blocks=64).generate([("r", prompt, params)])
    assert remote == inproc and len(remote["r"]) == 6


def test_bad_lookups_are_rejected(shards, sharded):
    with pytest.raises(ValueError, match="table"):
        sharded.lookup(2, np.zeros((1, 1), np.int64))
    with pytest.raises(ValueError, match="row_ids"):
        sharded.lookup(0, np.array([[CFG.engram_rows]]))
    with grpc.insecure_channel(shards.addresses[1]) as channel:
        stub = pb_grpc.EngramShardStub(channel)
        for request, field in [(pb.EngramLookupRequest(table=0, row_ids=np.array([0], "<i8").tobytes()), "row_ids"),
                               (pb.EngramLookupRequest(table=5, row_ids=b""), "table"),
                               (pb.EngramLookupRequest(table=0, row_ids=b"1234567"), "row_ids")]:
            with pytest.raises(grpc.RpcError) as err:
                stub.Lookup(request, timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in err.value.details()


def test_incomplete_shard_set_is_refused(shards):
    with pytest.raises(ValueError, match="shards"):
        ShardedEngramTable(shards.addresses[:3], timeout_s=5)
