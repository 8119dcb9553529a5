"""One scheduler for both clocks: the live Engine and the simulator's decode-rank scheduler (a
RankScheduler over a KVLedger with synthetic block names, as rackserve.sim builds it) give the same
schedule, step by step, for the same request stream - including the steps that preempt."""

from __future__ import annotations

import numpy as np
import pytest

from rackserve.kv.block_cache import BlockCache
from rackserve.model.config import ModelConfig
from rackserve.model.engine import Engine
from rackserve.model.sampling import SamplingParams
from rackserve.sched.kv_ledger import KVLedger, SyntheticIdentity
from rackserve.sched.limits import SchedulerLimits
from rackserve.sched.scheduler import RankScheduler
from rackserve.sched.seq_state import SeqState

BLOCK = 16
OUT = 10
# (step at which it arrives, prompt length)
STREAM = [(0, 40), (0, 23), (0, 57), (1, 16), (2, 70), (2, 9), (4, 33), (6, 48), (9, 31), (9, 64)]
Step = tuple[tuple[tuple[str, int], ...], tuple[str, ...]]


def _prompt(length: int, seed: int) -> list[int]:
    return np.random.default_rng(1000 + seed).integers(0, 256, length).tolist()


def _engine_schedule(num_blocks: int, budget: int, max_seqs: int) -> list[Step]:
    cfg = ModelConfig(max_context=512, block_size=BLOCK)
    engine = Engine.from_config(
        cfg, num_blocks=num_blocks, max_num_batched_tokens=budget, max_num_seqs=max_seqs
    )
    params = SamplingParams(max_tokens=OUT, temperature=0.0, ignore_eos=True)
    steps: list[Step] = []
    pending = list(enumerate(STREAM))
    while pending or engine.has_unfinished():
        for i, (_, length) in [p for p in pending if p[1][0] == len(steps)]:
            engine.add_request(f"r{i}", _prompt(length, i), params)
        pending = [p for p in pending if p[1][0] > len(steps)]
        plan = engine.step().schedule
        steps.append((tuple(zip(plan.req_ids, plan.new_tokens, strict=True)), plan.preempted))
    return steps


def _sim_schedule(num_blocks: int, budget: int, max_seqs: int) -> list[Step]:
    ledger = KVLedger(BlockCache(num_blocks, BLOCK), SyntheticIdentity(BLOCK))
    sched = RankScheduler(SchedulerLimits(budget, max_seqs), kv=ledger)
    steps: list[Step] = []
    pending = list(enumerate(STREAM))
    while pending or len(sched):
        for i, (_, length) in [p for p in pending if p[1][0] == len(steps)]:
            assert sched.admit(SeqState(f"r{i}", length, OUT))
        pending = [p for p in pending if p[1][0] > len(steps)]
        plan = sched.schedule()
        sched.update(plan)
        steps.append((tuple(zip(plan.req_ids, plan.new_tokens, strict=True)), plan.preempted))
    return steps


@pytest.mark.parametrize(
    "num_blocks, budget, max_seqs, preempts",
    [(256, 64, 8, False), (14, 48, 6, True)],
    ids=["roomy", "kv-starved"],
)
def test_engine_and_simulator_schedule_identically(num_blocks, budget, max_seqs, preempts):
    live = _engine_schedule(num_blocks, budget, max_seqs)
    sim = _sim_schedule(num_blocks, budget, max_seqs)
    assert len(live) == len(sim)
    for step, (a, b) in enumerate(zip(live, sim, strict=True)):
        assert a == b, f"step {step}: engine {a} != simulator {b}"
    assert any(pre for _, pre in live) == preempts
    assert sum(n for batch, _ in live for _, n in batch) >= sum(n for _, n in STREAM)
