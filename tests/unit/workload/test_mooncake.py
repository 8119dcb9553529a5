import json
from pathlib import Path

import pytest

from rackserve.kv.block_hash import block_hashes
from rackserve.workload.mooncake import iter_prompt_tokens, parse_record, read_trace, trace_requests

TRACE = str(Path(__file__).resolve().parents[3] / "data" / "mooncake_synthetic_trace.jsonl")


def _line(**over):
    rec = {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3]}
    rec.update(over)
    return json.dumps(rec)


def test_reads_the_real_trace_head():
    recs = read_trace(TRACE, limit=50)
    assert len(recs) == 50
    assert recs[0].input_length == 40160 and recs[0].output_length == 6
    assert recs[0].hash_ids[:3] == (0, 1, 2) and len(recs[0].hash_ids) == 79


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"timestamp": -1}, "timestamp"),
        ({"input_length": "12"}, "input_length"),
        ({"input_length": 0}, "input_length"),
        ({"output_length": 1.5}, "output_length"),
        ({"hash_ids": [1, -2, 3]}, "hash_ids"),
        ({"hash_ids": [1, 2]}, "hash_ids"),  # 1100 tokens need 3 ids of 512
    ],
)
def test_malformed_line_names_line_and_field(tmp_path, over, field):
    path = tmp_path / "t.jsonl"
    path.write_text(_line() + "\n" + _line(**over) + "\n")
    with pytest.raises(ValueError, match=rf"t\.jsonl:2: field '{field}'"):
        read_trace(path)


def test_not_json_names_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(_line() + "\n\n{oops\n")
    with pytest.raises(ValueError, match=r"t\.jsonl:3: not valid JSON"):
        read_trace(path)


def test_equal_hash_ids_give_equal_blocks_and_diverge_after():
    a = parse_record(_line(hash_ids=[7, 8, 9]), "a")
    b = parse_record(_line(hash_ids=[7, 8, 10]), "b")
    c = parse_record(_line(hash_ids=[6, 8, 9]), "c")
    ra, rb, rc = trace_requests([a, b, c], block_size=64, model_id="m")
    assert len(ra.block_hashes) == 1100 // 64 == 17
    assert ra.block_hashes[:16] == rb.block_hashes[:16]  # two shared 512-blocks = 16 blocks of 64
    assert ra.block_hashes[16] != rb.block_hashes[16]
    assert not set(ra.block_hashes) & set(rc.block_hashes)  # a different first block changes every hash


def test_hashes_follow_the_block_hash_spec_on_synthesized_tokens():
    rec = parse_record(_line(hash_ids=[3, 4, 5]), "x")
    (req,) = trace_requests([rec], block_size=64, model_id="m")
    tokens = list(iter_prompt_tokens(rec))
    assert len(tokens) == 1100
    assert req.block_hashes == tuple(block_hashes(tokens, 64, "m"))


def test_arrivals_in_seconds_scaled():
    recs = [parse_record(_line(timestamp=t), str(t)) for t in (1000, 1500, 4000)]
    reqs = trace_requests(recs, time_scale=0.5)
    assert [r.arrival_s for r in reqs] == [0.0, 0.25, 1.5]
    with pytest.raises(ValueError, match="timestamp"):
        trace_requests(list(reversed(recs)))


@pytest.mark.parametrize("block", [16, 64, 512])
def test_memoized_and_batched_hashes_equal_the_spec_on_every_record(block):
    """Records sharing prefixes of hash ids (memo hits, then a miss mid-record hashed in one batch),
    with last chunks full, partial and shorter than a block: every request's hashes equal block_hashes
    over its synthesized tokens, chunk by chunk."""
    import random

    rng = random.Random(block)
    recs = []
    for _ in range(40):
        n_ids = rng.randint(1, 6)
        ids = [rng.choice([1, 2, 3]) if i < 2 else rng.randint(0, 9) for i in range(n_ids)]
        length = (n_ids - 1) * 512 + rng.choice([1, 10, block - 1, block, block + 3, 511, 512])
        recs.append(parse_record(_line(hash_ids=ids, input_length=min(length, n_ids * 512)), "r"))
    for rec, req in zip(recs, trace_requests(recs, block_size=block, model_id="m"), strict=True):
        assert req.block_hashes == tuple(block_hashes(list(iter_prompt_tokens(rec)), block, "m"))
