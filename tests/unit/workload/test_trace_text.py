"""Mooncake records as text: exact token counts, shared hash ids -> shared prefixes."""

from __future__ import annotations

import json

from rackserve.model import tokenizer
from rackserve.workload.mooncake import TraceRecord
from rackserve.workload.trace_text import record_text, text_trace


def test_text_has_input_length_tokens_and_shares_prefixes() -> None:
    a = TraceRecord(0.0, 40, 4, (1, 2, 3))
    b = TraceRecord(5.0, 37, 4, (1, 2, 9))
    ta, tb = record_text(a, 16), record_text(b, 16)
    assert len(tokenizer.encode(ta)) == 40 and len(tokenizer.encode(tb)) == 37
    assert ta[:32] == tb[:32] and ta[32:37] != tb[32:37]


def test_more_tokens_than_blocks_gets_a_tail() -> None:
    assert len(record_text(TraceRecord(0.0, 50, 1, (4,)), 16)) == 50


def test_jsonl_rows() -> None:
    rows = [json.loads(line) for line in text_trace([TraceRecord(7.0, 20, 3, (0, 1))], 16)]
    assert rows == [{"timestamp": 7, "output_length": 3,
                     "text_input": record_text(TraceRecord(7.0, 20, 3, (0, 1)), 16)}]


def test_read_records_names_a_bad_line(tmp_path) -> None:
    import pytest

    from rackserve.workload.trace_text import read_records

    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 32, "output_length": 2, "hash_ids": [1, 2]}\n'
                    '{"timestamp": 1, "input_length": 16, "output_length": 2, "hash_ids": [1, 2]}\n')
    with pytest.raises(ValueError, match=r"t.jsonl:2: 2 hash ids are more than input_length 16"):
        read_records(path, 16)
    path.write_text('{"timestamp": 0, "input_length": 32, "output_length": 2, "hash_ids": [1, 2]}\n')
    assert read_records(path, 16) == [TraceRecord(0.0, 32, 2, (1, 2))]
