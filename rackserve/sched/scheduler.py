"""The one per-rank scheduler of the live engine and the simulator (vLLM v1 policy).

Each `schedule()` fills a token budget (`max_num_batched_tokens`): running sequences first, those
with a one-token (decode) step before chunked prefills, then waiting ones FCFS while fewer than
`max_num_seqs` run. When a running sequence cannot get its blocks, the newest running sequence not
yet scheduled this step is preempted (recompute: its blocks are released, its counters reset, it
waits at the head of the queue and later resumes, finding whatever of its KV is still cached), so a
step never fails for lack of KV. The result is a SchedulerOutput; `update()` applies it.

Without a KV ledger (the simulator's prefill ranks and unbounded decode ranks) blocks are not
counted. Decode ranks of the simulator also have a lazy path (`promote_decode`, `commit_decode`)
that leaps k identical decode steps at once; without a ledger it is exactly k `schedule()` calls.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection

from rackserve.sched.decode_batch import DecodeBatch, DecodeClock
from rackserve.sched.kv_ledger import KVLedger
from rackserve.sched.limits import SchedulerLimits
from rackserve.sched.output import ScheduledSeq, SchedulerOutput
from rackserve.sched.seq_state import SeqState


class QueueFull(Exception):
    """The rank already holds `max_queue` sequences: admission pushes back (HTTP 429 upstream)."""


class RankScheduler:
    """FCFS scheduler of one DP rank. `on_start(seq)` runs when a waiting sequence that never ran is
    considered for a step (the simulator's prefill rank looks up its prefix there, so blocks stored
    meanwhile are found); it runs again if the sequence could not be placed that step."""

    def __init__(
        self,
        limits: SchedulerLimits,
        on_start: Callable[[SeqState], None] | None = None,
        kv: KVLedger | None = None,
        decode_clock: DecodeClock | None = None,
        rank: int = 0,
    ) -> None:
        self.limits = limits
        self.on_start = on_start
        self.kv = kv
        self.waiting: deque[SeqState] = deque()
        self.running: list[SeqState] = []  # started, in start order (newest last)
        # the lazy decode path's batch; lockstep ranks may share one clock (`rank`: this one's index)
        self.decoding = DecodeBatch(decode_clock, rank)
        self.num_preemptions = 0
        self._reserved = 0  # lazy decode path: final context of the batch's sequences
        self._seqs: dict[int | str, SeqState] = {}
        self._step = 0

    def __len__(self) -> int:
        return len(self._seqs)

    def seq(self, req_id: int | str) -> SeqState:
        return self._seqs[req_id]

    def admit(self, seq: SeqState) -> bool:
        """Queue a sequence; False (rejected) when the rank's queue is full."""
        assert seq.req_id not in self._seqs, f"sequence {seq.req_id!r} is already here"
        if len(self._seqs) >= self.limits.max_queue:
            return False
        self._seqs[seq.req_id] = seq
        seq.delivered_tokens = seq.computed_tokens
        self.waiting.append(seq)
        return True

    def abort(self, req_id: int | str) -> bool:
        """Drop a sequence wherever it is (releasing its blocks); False if it is not here."""
        seq = self._seqs.pop(req_id, None)
        if seq is None:
            return False
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if self.kv is not None:
            self.kv.free(seq)
        return True

    def queued_prefill_tokens(self) -> int:
        return sum(s.prefill_left for s in self.running) + sum(s.prefill_left for s in self.waiting)

    # -- one step --------------------------------------------------------------------------------
    def schedule(self, admit: bool = True) -> SchedulerOutput:
        """One step's plan; `admit=False` schedules only the running sequences (waiting ones are held
        back this step: TensorRT-LLM's attention-DP balance, rackserve/sim/aggregated.py)."""
        self._step += 1
        if not self.running and not self.waiting:
            return SchedulerOutput(self._step)  # an idle rank
        budget = self.limits.max_num_batched_tokens
        picked: list[ScheduledSeq] = []
        done: set[int | str] = set()
        preempted: list[int | str] = []
        freed = 0
        for seq in sorted(self.running, key=lambda s: s.pending > 1):  # decode steps first
            if budget == 0:
                break
            if not seq.started:  # preempted earlier in this loop
                continue
            n = min(seq.pending, budget)
            blocks = self._allocate(seq, n)
            while blocks is None:
                victim = next(s for s in reversed(self.running) if s.req_id not in done)
                freed += self._preempt(victim)
                preempted.append(victim.req_id)
                if victim is seq:
                    break
                blocks = self._allocate(seq, n)
            if blocks is None:
                break
            picked.append(self._take(seq, n, blocks))
            done.add(seq.req_id)
            budget -= n
        while admit and not preempted and self.waiting and budget > 0:
            if len(self.running) >= self.limits.max_num_seqs:
                break
            seq = self.waiting[0]
            self._start(seq)
            n = min(seq.pending, budget)
            blocks = self._allocate(seq, n)
            if blocks is None:
                break
            self.waiting.popleft()
            seq.started = True
            self.running.append(seq)
            picked.append(self._take(seq, n, blocks, resumed=seq.preemptions > 0))
            budget -= n
        return SchedulerOutput(self._step, tuple(picked), tuple(preempted), freed)

    def update(self, out: SchedulerOutput, finished: Collection[int | str] = ()) -> list[SeqState]:
        """Apply a step: count computed tokens, sample where a sequence caught up, cache full
        blocks. Sequences that sampled their last token, or that the caller names in `finished`
        (EOS, context limit), leave and release their blocks; they are returned."""
        ended = []
        for s in out.seqs:
            seq = self._seqs[s.req_id]
            seq.computed_tokens += s.num_new_tokens
            if self.kv is not None:
                self.kv.commit_full(seq)
            if seq.pending == 0:
                seq.generated += 1
            if seq.decode_left <= 0 or s.req_id in finished:
                ended.append(seq)
        self._retire(ended)
        return ended

    def _retire(self, ended: list[SeqState]) -> None:
        """Finished sequences leave the batch and give their blocks back."""
        for seq in ended:
            self.running.remove(seq)
            del self._seqs[seq.req_id]
            if self.kv is not None:
                self.kv.free(seq)

    def _start(self, seq: SeqState) -> None:
        if self.on_start is not None and seq.preemptions == 0:
            self.on_start(seq)
        if self.kv is not None:  # (again, if it could not be placed last time: the cache changed)
            seq.computed_tokens = max(seq.delivered_tokens, self.kv.lookup(seq))
        assert seq.pending > 0, "a prefix hit is capped so that at least one token is computed"

    def _allocate(self, seq: SeqState, n: int) -> int | None:
        return 0 if self.kv is None else self.kv.allocate(seq, n)

    def _take(self, seq: SeqState, n: int, blocks: int, resumed: bool = False) -> ScheduledSeq:
        """The scheduled entry; pool fetches are charged once, on the first step that has them."""
        entry = ScheduledSeq(
            seq.req_id,
            n,
            seq.computed_tokens,
            blocks,
            seq.pool_hbm_tokens,
            seq.pool_dram_tokens,
            resumed,
        )
        seq.pool_hbm_tokens = seq.pool_dram_tokens = 0
        return entry

    def _preempt(self, seq: SeqState) -> int:
        """Recompute preemption: release the blocks, reset the counter, wait at the queue's head."""
        self.running.remove(seq)
        freed = self.kv.free(seq) if self.kv is not None else 0
        seq.computed_tokens = seq.delivered_tokens = 0
        seq.started = False
        seq.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        return freed

    # -- leaps over identical decode steps (the simulator) ------------------------------------------
    def decode_leap_steps(self, plan: SchedulerOutput) -> int:
        """After scheduling `plan`: how many identical decode steps, this one included, the rank
        can run before anything but context length changes (a finish, an admission, a preemption).
        The KV bound is safe: each running sequence needs at most one new block per block_size
        steps, so `1 + block_size * (free // running)` steps fit the free blocks."""
        n = len(self.running)
        if plan.preempted or not n or len(plan.seqs) != n:
            return 1
        if any(s.num_new_tokens != 1 or self._seqs[s.req_id].pending != 1 for s in plan.seqs):
            return 1
        # A waiting sequence could not get its blocks this step; free blocks only shrink until
        # a finish, so it stays waiting for the whole leap.
        finish = min(seq.decode_left for seq in self.running)
        if self.kv is None:
            return finish
        return max(1, min(finish, 1 + self.kv.block_size * (self.kv.num_free_blocks // n)))

    def advance_decode(self, steps: int) -> list[SeqState]:
        """Apply `steps` more identical decode steps to every running sequence (after `update` of
        the leap's first step; at most `decode_leap_steps - 1`). Returns those that finished."""
        ended = []
        for seq in self.running:
            if self.kv is not None:
                assert self.kv.allocate(seq, steps) is not None, "leap longer than the KV bound"
            seq.computed_tokens += steps
            seq.generated += steps
            if self.kv is not None:
                self.kv.commit_full(seq)
            if seq.decode_left <= 0:
                ended.append(seq)
        self._retire(ended)
        return ended

    # -- the simulator's lazy decode path (no KV ledger) -------------------------------------------
    def promote_decode(self) -> list[SeqState]:
        """Move waiting sequences into the lazy decode batch while slots and the KV reservation
        allow (FCFS, no overtaking), as `schedule()` would admit them without a ledger."""
        assert self.kv is None, "the lazy decode path does not count blocks"
        cap = self.limits.reserve_kv_tokens
        joined = []
        while self.waiting and len(self.decoding) < self.limits.max_num_seqs:
            need = self.waiting[0].computed_tokens + self.waiting[0].decode_left
            if cap is not None and self.decoding and self._reserved + need > cap:
                break
            seq = self.waiting.popleft()
            self._reserved += need
            self._start(seq)
            seq.started = True
            self.decoding.join(seq)
            joined.append(seq)
        return joined

    def decode_load(self) -> tuple[int, int]:
        """(sequences, context tokens) of the lazy decode batch, without walking it."""
        return len(self.decoding), self.decoding.context_tokens

    def decode_steps_to_next_finish(self) -> int:
        return self.decoding.steps_to_next_finish()

    def commit_decode(self, steps: int) -> list[SeqState]:
        """Apply `steps` identical decode steps of the lazy batch (at most up to its next finish);
        return the sequences that sampled their last token."""
        done = self.decoding.advance(steps)
        for seq in done:
            self.decoded(seq)
        return done

    def decoded(self, seq: SeqState) -> None:
        """A sequence of the lazy batch sampled its last token (its batch's clock let it go)."""
        del self._seqs[seq.req_id]
        self._reserved -= seq.computed_tokens
