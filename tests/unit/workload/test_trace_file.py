import gzip
import json

import pytest

from rackserve.workload.conversation import parse_conversation
from rackserve.workload.mooncake import read_trace
from rackserve.workload.trace_file import parse_line, read_conversations, trace_format
from tests.unit.workload.conversations import chain, conversation, marker, req

MOONCAKE = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}


def _write(path, objs, gz=False):
    text = "".join(json.dumps(o) + "\n" for o in objs)
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def test_formats_are_told_apart_by_content_not_name(tmp_path):
    convs = _write(tmp_path / "mooncake.jsonl", [chain(2)])  # a misleading name
    moon = _write(tmp_path / "agentx.jsonl.gz", [MOONCAKE], gz=True)
    assert trace_format(convs) == "conversation"
    assert trace_format(moon) == "mooncake"
    assert [r.input_length for r in read_trace(moon)] == [600]  # Mooncake reader takes .gz too


def test_unknown_content_and_empty_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match="neither a Mooncake record"):
        trace_format(_write(tmp_path / "a.jsonl", [{"x": 1}]))
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        trace_format(tmp_path / "e.jsonl")


def test_gzip_and_plain_read_the_same(tmp_path):
    objs = [chain(3, "a"), conversation([req(0, 200), marker(4, "completed", [req(0, 70, base=9)]), req(9, 300)], "b")]
    plain = read_conversations(_write(tmp_path / "c.jsonl", objs))
    packed = read_conversations(_write(tmp_path / "c.jsonl.gz", objs, gz=True))
    assert [c.conv_id for c in plain] == [c.conv_id for c in packed] == ["a", "b"]
    for a, b in zip(plain, packed, strict=True):
        assert [t.hash_ids.tolist() for t in a.all_turns()] == [t.hash_ids.tolist() for t in b.all_turns()]


def test_fast_reader_equals_plain_json_parse():
    obj = conversation([req(0, 64 * 5 + 3), marker(4, "async_launched", [req(0, 130, base=40)]), req(9, 64)])
    fast = parse_line(json.dumps(obj).encode(), "x")
    slow = parse_conversation(obj, "x")
    for a, b in zip(fast.all_turns(), slow.all_turns(), strict=True):
        assert (a.t_s, a.prompt_tokens, a.idle_before_s, a.hash_ids.tolist()) == (
            b.t_s, b.prompt_tokens, b.idle_before_s, b.hash_ids.tolist())


def test_a_bad_line_is_named(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(chain(1)) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"c.jsonl:2: not valid JSON"):
        read_conversations(path)
    bad = chain(1)
    bad["requests"][0]["hash_ids"] = [1, "x"]
    with pytest.raises(ValueError, match="field 'hash_ids' must be a list of integers"):
        parse_line(json.dumps(bad).encode(), "x")
