import numpy as np

from rackserve.sched.scheduler import RankScheduler, SchedulerLimits
from rackserve.sched.seq_state import SeqState


def test_prefill_chunks_share_the_token_budget_fcfs():
    s = RankScheduler(SchedulerLimits(chunk_tokens=1000, max_batch_seqs=8))
    a, b = SeqState(1, 1500, 4), SeqState(2, 300, 4)
    assert s.admit(a) and s.admit(b)
    p1 = s.schedule_prefill()
    assert p1.seqs == (a,) and p1.new_tokens == (1000,)
    assert s.commit_prefill(p1) == []
    p2 = s.schedule_prefill()
    assert p2.seqs == (a, b) and p2.new_tokens == (500, 300)
    np.testing.assert_array_equal(p2.batch.cached_tokens, [1000, 0])
    assert s.commit_prefill(p2) == [a, b]
    assert len(s) == 0 and s.schedule_prefill().empty


def test_on_start_prefix_hit_skips_cached_tokens_and_charges_pool_once():
    def hit(seq):
        seq.computed_tokens, seq.pool_dram_tokens = 640, 128

    s = RankScheduler(SchedulerLimits(chunk_tokens=100), on_start=hit)
    s.admit(SeqState(1, 1000, 1))
    assert s.queued_prefill_tokens() == 1000  # lookup happens when it starts, not at admission
    p = s.schedule_prefill()
    assert p.new_tokens == (100,) and p.batch.cached_tokens.tolist() == [640] and p.batch.pool_dram_tokens == 128
    s.commit_prefill(p)
    assert s.schedule_prefill().batch.pool_dram_tokens == 0
    assert s.queued_prefill_tokens() == 260


def test_admission_is_bounded():
    s = RankScheduler(SchedulerLimits(max_queue=2))
    assert s.admit(SeqState(1, 10, 1)) and s.admit(SeqState(2, 10, 1))
    assert not s.admit(SeqState(3, 10, 1))


def test_decode_cap_counters_and_leap():
    s = RankScheduler(SchedulerLimits(max_batch_seqs=2))
    seqs = [SeqState(i, 100, out, computed_tokens=100) for i, out in enumerate((3, 5, 2))]
    for q in seqs:
        s.admit(q)
    p = s.schedule_decode()
    assert p.seqs == tuple(seqs[:2]) and p.new_tokens == (1, 1)
    assert s.decode_steps_to_next_finish() == 3
    done = s.commit_decode(3)
    assert done == [seqs[0]] and seqs[0].generated == 3
    p = s.schedule_decode()  # the third joins the freed slot; planning syncs the counters
    assert p.seqs == (seqs[1], seqs[2])
    assert seqs[1].generated == 3 and seqs[1].computed_tokens == 103
    assert p.batch.cached_tokens.tolist() == [103, 100]


def test_decode_kv_capacity_holds_back_admission():
    s = RankScheduler(SchedulerLimits(max_batch_seqs=8, kv_tokens_capacity=200))
    a, b = SeqState(1, 100, 10, computed_tokens=100), SeqState(2, 100, 10, computed_tokens=100)
    s.admit(a)
    s.admit(b)
    assert s.schedule_decode().seqs == (a,)  # each reserves 110 tokens (prompt + outputs): 220 > 200
    s.schedule_decode()
    s.commit_decode(10)
    assert s.schedule_decode().seqs == (b,)


def test_decode_load_tracks_context_without_walking_the_batch():
    s = RankScheduler(SchedulerLimits(max_batch_seqs=8))
    a, b = SeqState(1, 100, 4, computed_tokens=100), SeqState(2, 300, 9, computed_tokens=300)
    s.admit(a)
    s.admit(b)
    assert s.promote_decode() == [a, b]
    assert s.decode_load() == (2, 400)
    assert s.commit_decode(4) == [a]
    assert (a.generated, a.computed_tokens) == (4, 104)
    assert s.decode_load() == (1, 304)
    assert b.generated == 0  # lazy: not synced yet
    plan = s.schedule_decode()
    assert plan.seqs == (b,) and b.generated == 4 and plan.batch.cached_tokens.tolist() == [304]
    assert s.decode_steps_to_next_finish() == 5
