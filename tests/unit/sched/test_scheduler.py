import numpy as np

from rackserve.kv.block_cache import BlockCache
from rackserve.sched.kv_ledger import KVLedger, SyntheticIdentity
from rackserve.sched.limits import VLLM_MAX_NUM_BATCHED_TOKENS, VLLM_MAX_NUM_SEQS, SchedulerLimits
from rackserve.sched.scheduler import RankScheduler
from rackserve.sched.seq_state import SeqState


def _ledger(blocks: int, block_size: int = 4) -> KVLedger:
    return KVLedger(BlockCache(blocks, block_size), SyntheticIdentity(block_size))


def test_defaults_are_vllm_v1_api_server_on_a_large_gpu():
    limits = SchedulerLimits()
    assert (limits.max_num_batched_tokens, limits.max_num_seqs) == (8192, 1024)
    assert (VLLM_MAX_NUM_BATCHED_TOKENS, VLLM_MAX_NUM_SEQS) == (8192, 1024)
    assert limits.preemption_mode == "recompute"


def test_prefill_chunks_share_the_token_budget_fcfs():
    s = RankScheduler(SchedulerLimits(max_num_batched_tokens=1000, max_num_seqs=8))
    a, b = SeqState(1, 1500, 1), SeqState(2, 300, 1)
    assert s.admit(a) and s.admit(b)
    p1 = s.schedule()
    assert p1.req_ids == (1,) and p1.new_tokens == (1000,)
    assert s.update(p1) == []
    p2 = s.schedule()
    assert p2.req_ids == (1, 2) and p2.new_tokens == (500, 300)
    np.testing.assert_array_equal(p2.rank_batch().cached_tokens, [1000, 0])
    assert s.update(p2) == [a, b]
    assert len(s) == 0 and s.schedule().empty


def test_decode_steps_go_before_prefill_chunks():
    s = RankScheduler(SchedulerLimits(max_num_batched_tokens=8))
    long, short = SeqState("long", 20, 3), SeqState("short", 4, 3)
    s.admit(long)
    s.admit(short)
    s.update(s.schedule())  # long takes the whole budget
    out = s.schedule()  # long continues, short starts with what is left
    assert out.req_ids == ("long",) and out.new_tokens == (8,)
    s.update(out)
    s.update(s.schedule())  # long's last 4 + short's 4: both sample
    out = s.schedule()
    assert out.req_ids == ("long", "short") and out.new_tokens == (1, 1)


def test_on_start_prefix_hit_skips_cached_tokens_and_charges_pool_once():
    def hit(seq):
        seq.computed_tokens, seq.pool_dram_tokens = 640, 128

    s = RankScheduler(SchedulerLimits(max_num_batched_tokens=100), on_start=hit)
    s.admit(SeqState(1, 1000, 1))
    assert s.queued_prefill_tokens() == 1000  # lookup happens when it starts, not at admission
    p = s.schedule()
    assert p.new_tokens == (100,) and p.rank_batch().cached_tokens.tolist() == [640]
    assert p.rank_batch().pool_dram_tokens == 128
    s.update(p)
    assert s.schedule().rank_batch().pool_dram_tokens == 0
    assert s.queued_prefill_tokens() == 260


def test_admission_is_bounded():
    s = RankScheduler(SchedulerLimits(max_queue=2))
    assert s.admit(SeqState(1, 10, 1)) and s.admit(SeqState(2, 10, 1))
    assert not s.admit(SeqState(3, 10, 1))


def test_max_num_seqs_caps_running():
    s = RankScheduler(SchedulerLimits(max_num_seqs=2))
    for i in range(3):
        s.admit(SeqState(i, 5, 4))
    assert s.schedule().req_ids == (0, 1)
    assert len(s.waiting) == 1


def test_blocks_run_out_newest_running_is_preempted_and_resumes_with_its_cached_prefix():
    # 4-token blocks, 5 blocks. Two sequences of 8-token prompts take 2 blocks each (+1 each for
    # the first decode token): the third block of the second cannot be had; it is preempted.
    s = RankScheduler(SchedulerLimits(max_num_batched_tokens=64), kv=_ledger(5))
    a, b = SeqState("a", 8, 6), SeqState("b", 8, 6)
    s.admit(a)
    s.admit(b)
    first = s.schedule()
    assert first.req_ids == ("a", "b") and [x.num_new_blocks for x in first.seqs] == [2, 2]
    s.update(first)  # both sampled their first token: 9 known tokens each, 8 in KV
    second = s.schedule()  # a gets the fifth block; b needs a sixth: b (newest) is preempted
    assert second.req_ids == ("a",) and second.preempted == ("b",) and second.num_freed_blocks == 2
    assert s.num_preemptions == 1 and b.computed_tokens == 0 and s.waiting[0] is b
    s.update(second)
    for _ in range(3):  # a decodes alone; b waits (its blocks are free, still cached)
        out = s.schedule()
        assert out.req_ids == ("a",)
        s.update(out)
    s.update(s.schedule())  # a's last token: it leaves and frees its 4 blocks
    resumed = s.schedule()
    (entry,) = resumed.seqs
    # b resumes with what survived: its freed blocks were queued last block first, so a's fourth
    # block evicted b's second; b's first is still cached (4 tokens) and the rest is recomputed,
    # although b was looked up (8 tokens found) while it waited: a stale lookup must not count.
    assert entry.req_id == "b" and entry.resumed and entry.num_computed_tokens == 4
    assert entry.num_new_tokens == 5 and b.preemptions == 1


def test_lone_sequence_preempts_itself_never_raises():
    s = RankScheduler(SchedulerLimits(), kv=_ledger(2))
    s.admit(SeqState("a", 7, 1))
    s.admit(SeqState("b", 7, 1))
    out = s.schedule()
    assert out.req_ids == ("a",) and not out.preempted  # b cannot get its blocks: it waits
    s.update(out)
    assert s.schedule().req_ids == ("b",)


def test_lazy_decode_path_counters_and_leap():
    s = RankScheduler(SchedulerLimits(max_num_seqs=2))
    seqs = [SeqState(i, 101, out, computed_tokens=100) for i, out in enumerate((3, 5, 2))]
    for q in seqs:
        s.admit(q)
    assert s.promote_decode() == seqs[:2]
    assert s.decode_steps_to_next_finish() == 3
    done = s.commit_decode(3)
    assert done == [seqs[0]] and seqs[0].generated == 3
    assert s.promote_decode() == [seqs[2]]  # the third joins the freed slot
    assert s.decode_load() == (2, 103 + 100)
    assert s.decoding.sync() == [seqs[1], seqs[2]] and seqs[1].computed_tokens == 103


def test_lazy_decode_leap_equals_scheduled_steps_without_a_ledger():
    def run(lazy: bool) -> list[tuple[int, int]]:
        s = RankScheduler(SchedulerLimits(max_num_seqs=2))
        for i, out in enumerate((3, 5, 2)):
            s.admit(SeqState(i, 11, out, computed_tokens=10))
        finished = []
        step = 0
        while len(s):
            if lazy:
                s.promote_decode()
                k = s.decode_steps_to_next_finish()
                step += k
                finished += [(q.req_id, step) for q in s.commit_decode(k)]
            else:
                step += 1
                finished += [(q.req_id, step) for q in s.update(s.schedule())]
        return finished

    assert sorted(run(lazy=True)) == sorted(run(lazy=False)) == [(0, 3), (1, 5), (2, 5)]


def test_leaps_with_a_ledger_equal_step_by_step():
    def run(leap: bool) -> tuple[list[tuple[str, int]], int]:
        s = RankScheduler(SchedulerLimits(max_num_batched_tokens=64), kv=_ledger(14))
        for i, (prompt, out) in enumerate(((9, 12), (5, 20), (13, 7), (3, 30))):
            s.admit(SeqState(f"s{i}", prompt + 1, out, computed_tokens=prompt))
        finished, step = [], 0
        while len(s):
            plan = s.schedule()
            k = s.decode_leap_steps(plan) if leap else 1
            ended = s.update(plan) + (s.advance_decode(k - 1) if k > 1 else [])
            step += k
            finished += [(q.req_id, step) for q in ended]
        return sorted(finished), s.num_preemptions

    stepped, leaped = run(leap=False), run(leap=True)
    assert stepped == leaped and stepped[1] > 0  # the same finishes and preemptions
