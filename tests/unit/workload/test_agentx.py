import pytest

from rackserve.workload.agentx import AgentXSource
from rackserve.workload.spec import parse_workload

SPEC = {"kind": "agentx", "concurrency": 3, "sessions": 5, "seed": 7, "system_prompt_tokens": 640,
        "tool_defs_tokens": 320, "first_user_tokens": 100, "turns_min": 3, "turns_max": 5,
        "tool_output_tokens_min": 50, "tool_output_tokens_max": 300, "output_tokens": 40,
        "think_time_mean_s": 1.0, "subagent_probability": 0.0}


def _drive(spec: dict) -> list:
    """Run the closed loop with every request done 1 s after it arrives, in arrival order."""
    src = AgentXSource(parse_workload(spec), block_size=64, model_id="m")
    pending = sorted(src.start(), key=lambda r: (r.arrival_s, r.req_id))
    issued = []
    while pending:
        req = pending.pop(0)
        issued.append(req)
        pending.extend(src.on_done(req, req.arrival_s + 1.0))
        pending.sort(key=lambda r: (r.arrival_s, r.req_id))
    return issued


def test_lanes_start_and_sessions_run_to_completion():
    reqs = _drive(SPEC)
    assert len({r.session for r in reqs}) == 5
    turns = {}
    for r in reqs:
        turns.setdefault(r.session, []).append(r)
    for sess in turns.values():
        assert 3 <= len(sess) <= 5


def test_conversation_grows_and_resends_its_prefix():
    reqs = [r for r in _drive(SPEC) if r.session == 0]
    for prev, nxt in zip(reqs, reqs[1:], strict=False):
        assert nxt.arrival_s >= prev.arrival_s + 1.0  # done after 1 s, then think time
        assert nxt.prompt_tokens >= prev.prompt_tokens + prev.output_tokens + 50
        assert nxt.block_hashes[: len(prev.block_hashes)] == prev.block_hashes


def test_sessions_share_the_system_prompt_and_tools_only():
    reqs = _drive(SPEC)
    firsts = {}
    for r in reqs:
        firsts.setdefault(r.session, r)
    a, b = firsts[0], firsts[1]
    shared = (640 + 320) // 64
    assert a.block_hashes[:shared] == b.block_hashes[:shared]
    assert a.block_hashes[shared] != b.block_hashes[shared]


def test_same_seed_same_sessions_other_seed_differs():
    assert [(r.prompt_tokens, r.block_hashes) for r in _drive(SPEC)] == [
        (r.prompt_tokens, r.block_hashes) for r in _drive(SPEC)]
    other = _drive({**SPEC, "seed": 8})
    assert [r.prompt_tokens for r in other] != [r.prompt_tokens for r in _drive(SPEC)]


def test_subagents_start_from_the_parents_context():
    reqs = _drive({**SPEC, "subagent_probability": 1.0, "sessions": 1, "concurrency": 1})
    subs = [r for r in reqs if r.turn >= 1000]
    assert subs, "probability 1 must spawn subagents"
    parent = max((r for r in reqs if r.turn < 1000 and r.arrival_s < subs[0].arrival_s), key=lambda r: r.arrival_s)
    assert subs[0].block_hashes[: len(parent.block_hashes)] == parent.block_hashes


def test_duration_stops_new_turns():
    reqs = _drive({**SPEC, "duration_s": 3.0, "sessions": 100})
    assert reqs and max(r.arrival_s for r in reqs) < 3.0


@pytest.mark.parametrize(
    ("over", "field"),
    [({"concurrency": 0}, "workload.concurrency"), ({"bogus": 1}, "workload.bogus"),
     ({"kind": "nope"}, "workload.kind"), ({"output_tokens": "many"}, "workload.output_tokens")],
)
def test_bad_spec_names_the_field(over, field):
    with pytest.raises(ValueError, match=field):
        parse_workload({**SPEC, **over})
