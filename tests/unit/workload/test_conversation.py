import numpy as np
import pytest

from rackserve.workload.conversation import FanOut, Turn, parse_conversation
from tests.unit.workload.conversations import conversation, marker, req


def test_partial_last_block_has_no_id_and_lengths_are_kept():
    conv = parse_conversation(conversation([req(0, 64 * 3 + 17, out=5)]), "x")
    (turn,) = conv.steps
    assert turn.prompt_tokens == 209 and turn.output_tokens == 5
    assert turn.hash_ids.dtype == np.uint64 and turn.hash_ids.tolist() == [1, 2, 3]


def test_hash_ids_must_match_full_blocks():
    bad = req(0, 64 * 3)
    bad["hash_ids"] = [1, 2]
    with pytest.raises(ValueError, match=r"x requests\[0\]: field 'hash_ids' has 2 ids, 'in' 192 needs 3"):
        parse_conversation(conversation([bad]), "x")


def test_think_time_recorded_or_difference_of_t():
    reqs = [req(0, 128, think=0.0), req(30, 192, think=12.0), req(50, 256)]  # the last lacks think_time
    steps = parse_conversation(conversation(reqs), "x").steps
    assert [s.idle_before_s for s in steps] == [0.0, 12.0, 20.0]


def test_consecutive_markers_are_one_fan_out_and_the_join_gap_is_after_the_last_completed():
    sub = [req(0, 128, base=100), req(5, 192, base=100, think=2.0)]
    reqs = [req(0, 256, think=0.0), marker(40, "completed", sub, "a1"), marker(55, "completed", sub, "a2"),
            req(62, 320, think=61.0)]
    conv = parse_conversation(conversation(reqs), "x")
    assert [type(s) for s in conv.steps] == [Turn, FanOut, Turn]
    fan = conv.steps[1]
    assert [s.agent_id for s in fan.subagents] == ["a1", "a2"] and all(s.gates for s in fan.subagents)
    assert [t.idle_before_s for t in fan.subagents[0].turns] == [0.0, 2.0]
    assert conv.steps[2].idle_before_s == 7.0  # 62 - 55, not the recorded 61 s think time
    assert len(conv.all_turns()) == 6 and conv.parent_turns == [0, 2]


def test_async_subagents_do_not_gate_and_keep_the_parent_think_time():
    reqs = [req(0, 256, think=0.0), marker(3, "async_launched", [req(0, 128, base=100)]), req(20, 320, think=16.0)]
    conv = parse_conversation(conversation(reqs), "x")
    assert not conv.steps[1].subagents[0].gates
    assert conv.steps[2].idle_before_s == 16.0


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"status": "done"}, "field 'status' must be one of completed, async_launched"),
        ({"requests": [marker(0, "completed", [])]}, "subagents nest one level deep only"),
        ({"requests": "x"}, "field 'requests' of a subagent must be a list"),
    ],
)
def test_bad_markers_name_the_field(patch, message):
    reqs = [req(0, 128), marker(5, "completed", [req(0, 64, base=50)]) | patch, req(9, 192)]
    with pytest.raises(ValueError, match=message):
        parse_conversation(conversation(reqs), "f:3")


def test_bad_request_fields_are_named():
    with pytest.raises(ValueError, match=r"requests\[0\]: field 'in' must be an integer"):
        parse_conversation(conversation([req(0, 64) | {"in": "64"}]), "x")
    with pytest.raises(ValueError, match="field 'block_size' must be 64"):
        parse_conversation(conversation([req(0, 64)]) | {"block_size": 16}, "x")
    with pytest.raises(ValueError, match="field 'requests' must be a non-empty list"):
        parse_conversation(conversation([]), "x")


def test_zero_output_is_sent_as_one_token():
    (turn,) = parse_conversation(conversation([req(0, 64, out=0)]), "x").steps
    assert turn.output_tokens == 1
