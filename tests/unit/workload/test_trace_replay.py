import gzip
import heapq
import itertools
import json

import pytest

from rackserve.sim.metrics import ideal_hit_rate
from rackserve.workload.conversation import parse_conversation
from rackserve.workload.spec import DEFAULT_AGENTX_TRACE, parse_workload
from rackserve.workload.trace_file import read_conversations
from rackserve.workload.trace_replay import TraceReplaySource
from tests.unit.workload.conversations import chain, conversation, marker, req

LATENCY_S = 1.0  # every request is done this long after it arrives


def _spec(**kw):
    return parse_workload({"kind": "agentx-trace", "concurrency": 1, "duration_s": 1e6, "measure_start_s": 0.0} | kw)


def _source(objs, **kw):
    convs = [parse_conversation(o, f"c{i}") for i, o in enumerate(objs)]
    return TraceReplaySource(convs, _spec(**kw), block_size=64, model_id="m")


def _drive(src, until_session=None, latency=LATENCY_S):
    """Run the closed loop; requests of sessions >= until_session are dropped (never done)."""
    heap = [(r.arrival_s, r.req_id, r) for r in src.start()]
    heapq.heapify(heap)
    out = []
    while heap:
        at, _, r = heapq.heappop(heap)
        if until_session is not None and r.session >= until_session:
            continue
        out.append(r)
        for nxt in src.on_done(r, at + latency):
            heapq.heappush(heap, (nxt.arrival_s, nxt.req_id, nxt))
    return out


def test_initial_lane_warms_up_with_the_turn_before_t_star_then_goes_on():
    # 10 turns 20 s apart: duration 180 s, t* = 0.5 * 180 = 90 s -> warm-up is the turn at t=80 (index 4)
    reqs = _drive(_source([chain(10)], start_ratio_min=0.5, start_ratio_max=0.5), until_session=1)
    assert reqs[0].warmup and reqs[0].turn == 4 and reqs[0].arrival_s == 0.0
    assert [r.turn for r in reqs[1:]] == [5, 6, 7, 8, 9] and not any(r.warmup for r in reqs[1:])
    # end-to-start: done 1 s after arrival, recorded think 19 s capped at 10 s
    assert reqs[1].arrival_s == pytest.approx(reqs[0].arrival_s + LATENCY_S + 10.0)
    assert reqs[0].prompt_tokens == 640 + 4 * 128


def test_t_star_is_drawn_per_lane_within_the_ratio_range():
    src = _source([chain(21)], concurrency=64, start_ratio_min=0.25, start_ratio_max=0.75)
    turns = [r.turn for r in src.start()]  # 20 gaps of 20 s: warm-up turn in [4, 15]
    assert all(r for r in src.start()) and min(turns) >= 4 and max(turns) <= 15 and len(set(turns)) > 5


def test_recycled_lane_starts_its_next_conversation_at_turn_zero_without_warmup():
    src = _source([chain(4, "a"), chain(3, "b")], start_ratio_min=0.5, start_ratio_max=0.5)
    reqs = _drive(src, until_session=3)
    by_session = {}
    for r in reqs:
        by_session.setdefault(r.session, []).append(r)
    assert by_session[0][0].warmup
    for later in (1, 2):
        first = by_session[later][0]
        assert first.turn == 0 and not first.warmup
        assert first.arrival_s == pytest.approx(by_session[later - 1][-1].arrival_s + LATENCY_S)  # at once
        assert len(by_session[later]) in (3, 4)  # the whole conversation, from turn 0


def test_cache_bust_no_block_shared_across_lanes_but_prefix_shared_within_one():
    src = _source([chain(6)], concurrency=8, start_ratio_min=0.0, start_ratio_max=0.0)
    reqs = _drive(src, until_session=8)
    lanes: dict[int, set[int]] = {}
    for r in reqs:
        lanes.setdefault(r.lane, set()).update(r.block_hashes)
    sets = list(lanes.values())
    assert len(sets) == 8
    assert all(not (a & b) for i, a in enumerate(sets) for b in sets[i + 1:])
    one = [r for r in reqs if r.lane == 0]
    for prev, nxt in zip(one, one[1:], strict=False):
        assert nxt.block_hashes[: len(prev.block_hashes)] == prev.block_hashes
    assert ideal_hit_rate(reqs, 64) == pytest.approx(ideal_hit_rate(one, 64))  # lanes add no hits


def _fan_out_conversation(second_status="completed"):
    sub_a = [req(0, 256, base=100), req(4, 320, base=100, think=1.0)]  # siblings share ids 100..103
    sub_b = [req(0, 256, base=100)]
    return conversation([
        req(0, 640, think=0.0), marker(30, "completed", sub_a, "a"), marker(31, second_status, sub_b, "b"),
        req(33, 768, think=30.0), req(50, 832, think=15.0),
    ])


def test_fan_out_runs_subagents_in_parallel_and_the_parent_waits_for_the_join():
    reqs = _drive(_source([_fan_out_conversation()], start_ratio_min=0, start_ratio_max=0), until_session=1)
    parent0, a0, b0, a1, parent1, parent2 = reqs
    assert a0.arrival_s == b0.arrival_s == parent0.arrival_s + LATENCY_S  # right after the parent's turn
    assert a0.turn == 1000 and b0.turn == 2000 and a1.turn == 1001
    join = a1.arrival_s + LATENCY_S  # the last gating subagent ends
    assert parent1.turn == 2 and parent1.arrival_s == pytest.approx(join + 2.0)  # 33 - 31 recorded
    assert parent2.arrival_s == pytest.approx(parent1.arrival_s + LATENCY_S + 10.0)  # 15 s capped
    assert a0.block_hashes[:4] == b0.block_hashes[:4]  # siblings share their common prefix
    assert not set(a0.block_hashes) & set(parent0.block_hashes)  # never the parent's


def test_async_subagent_gates_nothing_and_the_lane_waits_for_the_whole_tree():
    conv = _fan_out_conversation("async_launched")
    conv["requests"][2]["requests"] = [req(i * 5, 256, base=100, think=60.0) for i in range(4)]  # long-running
    src = _source([conv, chain(2, "next")], start_ratio_min=0, start_ratio_max=0)
    reqs = _drive(src, until_session=2)
    parent1 = next(r for r in reqs if r.session == 0 and r.turn == 2)
    a1 = next(r for r in reqs if r.session == 0 and r.turn == 1001)
    assert parent1.arrival_s == pytest.approx(a1.arrival_s + LATENCY_S + 3.0)  # joins `a` only: 33 - 30
    last_of_tree = max(r.arrival_s for r in reqs if r.session == 0)
    b_last = max(r.arrival_s for r in reqs if r.turn >= 2000)
    assert last_of_tree == b_last > max(r.arrival_s for r in reqs if r.session == 0 and r.turn < 1000)
    nxt = next(r for r in reqs if r.session == 1)
    assert nxt.arrival_s == pytest.approx(b_last + LATENCY_S)  # recycled when the async one ended


def test_overflow_is_counted_ends_the_tree_and_invalidates_the_run():
    # turns of 640, 768, ... tokens + 10 out; max_context 900: turn 2 (896 + 10) overflows
    src = _source([chain(5, grow=128)], start_ratio_min=0, start_ratio_max=0, max_context=900)
    reqs = _drive(src, until_session=3)
    assert [r.turn for r in reqs] == [0, 1, 0, 1, 0, 1]  # each replay stops at its overflow, lane recycles
    stats = src.stats()
    assert stats.overflows == 3 and stats.requests == 7 and not stats.valid  # + session 3's first
    assert _source([chain(3)], max_context=10**6).stats().valid


def test_first_requests_that_never_fit_are_refused():
    with pytest.raises(ValueError, match="max_context: 100 tokens is too small"):
        _source([chain(2)], max_context=100).start()


def test_nothing_is_sent_at_or_after_duration():
    reqs = _drive(_source([chain(50)], start_ratio_min=0, start_ratio_max=0, duration_s=60.0))
    assert reqs and max(r.arrival_s for r in reqs) < 60.0
    assert len(reqs) == 6  # every 11 s: 0, 11, ..., 55


def test_length_scale_shrinks_prompts_and_keeps_prefix_sharing():
    reqs = _drive(_source([chain(4)], start_ratio_min=0, start_ratio_max=0, length_scale=0.25), until_session=1)
    assert [r.prompt_tokens for r in reqs] == [160, 192, 224, 256]
    for prev, nxt in zip(reqs, reqs[1:], strict=False):
        assert nxt.block_hashes[: len(prev.block_hashes)] == prev.block_hashes
    assert len(reqs[-1].block_hashes) == 256 // 64


def test_spec_validation_names_the_field():
    with pytest.raises(ValueError, match=r"workload.concurrency"):
        parse_workload({"kind": "agentx-trace", "concurrency": 0})
    with pytest.raises(ValueError, match="start_ratio_min must be <= start_ratio_max"):
        parse_workload({"kind": "agentx-trace", "concurrency": 1, "start_ratio_min": 0.8, "start_ratio_max": 0.3})
    with pytest.raises(ValueError, match=r"workload.length_scale"):
        parse_workload({"kind": "agentx-trace", "concurrency": 1, "length_scale": 0})
    spec = parse_workload({"kind": "agentx-trace", "concurrency": 1, "measure_start_s": 100, "measure_s": 900,
                           "duration_s": 960})  # fmt: skip
    assert spec.measure_window == (100, 960)


def _trace_ideal(path, limit):
    """Reference from the raw JSON (not our reader): per conversation, in file order, each request
    hits its longest prefix of hash ids seen earlier in the conversation (capped at in - 1)."""
    hit = total = 0
    with gzip.open(path, "rt") as fh:
        for line in itertools.islice(fh, limit):
            seen: set[int] = set()
            for r in json.loads(line)["requests"]:
                for q in r["requests"] if r["type"] == "subagent" else [r]:
                    n = next((i for i, h in enumerate(q["hash_ids"]) if h not in seen), len(q["hash_ids"]))
                    hit += min(64 * n, q["in"] - 1)
                    total += q["in"]
                    seen.update(q["hash_ids"])
    return hit / total


def test_real_trace_in_lane_ideal_hit_equals_the_trace_ideal():
    """The first conversations once each from turn 0, one lane each: the unbounded-cache hit of the
    replayed block ids equals the trace's own ideal (96.2 % over the whole file, README)."""
    limit = 30
    convs = read_conversations(DEFAULT_AGENTX_TRACE, limit=limit)
    src = TraceReplaySource(convs, _spec(concurrency=limit, start_ratio_min=0, start_ratio_max=0))
    reqs = _drive(src, until_session=limit)
    assert len(reqs) == sum(len(c.all_turns()) for c in convs)
    expected = _trace_ideal(DEFAULT_AGENTX_TRACE, limit)
    assert 0.9 < expected < 0.99
    assert ideal_hit_rate(reqs, 64) == pytest.approx(expected, abs=1e-9)


def test_warmup_first_holds_every_lane_until_the_last_warmup_is_done():
    # lane k's requests take 1 + k seconds: lane 2's warm-up ends last, at 3 s
    src = _source([chain(10)], concurrency=3, start_ratio_min=0.5, start_ratio_max=0.5, warmup_first=True,
                  duration_s=50.0)
    heap = [(r.arrival_s, r.req_id, r) for r in src.start()]
    assert all(r.warmup for _, _, r in heap) and src.released_at_s is None
    sent = []
    while heap:
        at, _, r = heapq.heappop(heap)
        sent.append(r)
        for nxt in src.on_done(r, at + 1.0 + r.lane):
            heapq.heappush(heap, (nxt.arrival_s, nxt.req_id, nxt))
    assert src.released_at_s == 3.0
    later = [r for r in sent if not r.warmup]
    firsts = {lane: min(r.arrival_s for r in later if r.lane == lane) for lane in range(3)}
    assert firsts == {0: 13.0, 1: 13.0, 2: 13.0}  # all go on together: release + think 19 s capped at 10 s
    assert max(r.arrival_s for r in later) < 3.0 + 50.0  # duration counts from the release


def test_without_warmup_first_a_lane_goes_on_after_its_own_warmup():
    src = _source([chain(10)], concurrency=3, start_ratio_min=0.5, start_ratio_max=0.5)
    assert src.released_at_s == 0.0
    reqs = {r.lane: r for r in src.start()}
    assert src.on_done(reqs[0], 1.0)[0].arrival_s == 11.0


def _lane_sessions(reqs):
    """Each session's (first arrival, first turn), in order of first arrival."""
    first = {}
    for r in reqs:
        first.setdefault(r.session, (r.arrival_s, r.turn, r.warmup))
    return sorted(first.values())


def test_a_lanes_schedule_opens_lanes_late_at_turn_zero_and_lets_sessions_finish_when_it_drops():
    # lanes 1 -> 3 at 100 s -> 1 at 300 s; each conversation: 4 turns 20 s apart (~33 s at 1 s latency + 10 s think)
    src = _source([chain(4, "a"), chain(4, "b")], lanes_schedule=[[0, 1], [100, 3], [300, 1]], duration_s=600.0,
                  start_ratio_min=0.0, start_ratio_max=0.0)
    assert src.spec.concurrency == 3  # the most lanes the schedule runs
    reqs = _drive(src)
    sessions = _lane_sessions(reqs)
    late = [s for s in sessions if s[0] >= 100.0]
    # the two lanes opened at 100 s start new sessions there, at turn 0, not as warm-ups
    assert [s for s in late if s[0] == 100.0] == [(100.0, 0, False)] * 2
    # three lanes between 100 s and 300 s: three sessions at a time
    assert max(sum(1 for lo, hi in _spans(reqs).values() if lo <= t <= hi) for t in range(100, 300)) == 3
    # sessions under way when the schedule drops run to their end (all 4 turns) ...
    spans = _spans(reqs)
    count = {k: sum(1 for r in reqs if r.session == k) for k in spans}
    assert any(lo < 300.0 < hi for lo, hi in spans.values())
    assert all(count[k] == 4 for k, (lo, hi) in spans.items() if lo < 560.0)  # not cut by duration_s
    # ... and after 300 s only lane 0 starts sessions: those never overlap
    after = sorted(v for v in spans.values() if v[0] >= 300.0)
    assert len(after) >= 5 and all(b[0] > a[1] for a, b in zip(after, after[1:], strict=False))


def _spans(reqs):
    spans = {}
    for r in reqs:
        lo, hi = spans.get(r.session, (r.arrival_s, r.arrival_s))
        spans[r.session] = (min(lo, r.arrival_s), max(hi, r.arrival_s))
    return spans


def test_a_lanes_schedule_with_warmup_first_is_refused():
    with pytest.raises(ValueError, match="lanes_schedule and warmup_first"):
        _spec(lanes_schedule=[[0, 2]], warmup_first=True)
