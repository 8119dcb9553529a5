"""A rank's running decode batch with lazy counters, so leaping k steps costs O(finished log n).

Every running sequence gains one token per step. Instead of touching each sequence per step, a
clock counts the steps; a sequence's counters are brought up to date (`sync`) only when it finishes
or someone needs them. A heap keyed by the step a sequence finishes gives the next finish in O(1),
and each batch keeps its total context as `base + sequences * step`, so the cost model needs no
per-sequence walk.

Ranks that decode in lockstep (the DP ranks of one simulated instance) may share one DecodeClock:
then one `clock.advance(k)` moves every rank's batch k steps at once and yields the finished
sequences of all of them, rank by rank (the order a per-rank loop would give), in O(finished log n)
whatever the number of ranks. A batch built without a clock has its own.
"""

from __future__ import annotations

import heapq

from rackserve.sched.seq_state import SeqState


class DecodeClock:
    """The step counter and finish heap shared by the batches of ranks decoding in lockstep, with
    their totals: `seqs` sequences, `context_tokens` KV tokens, `counts[rank]` sequences per rank."""

    def __init__(self, ranks: int = 1) -> None:
        self.step = 0
        self.seqs = 0
        self.counts = [0] * ranks
        self.active = 0  # ranks with at least one sequence
        self._base = 0  # sum over sequences of (computed tokens - step) at their last sync
        self._heap: list[tuple[int, int, int | str, SeqState, DecodeBatch]] = []  # (finish, rank, id, ...)

    @property
    def context_tokens(self) -> int:
        return self._base + self.seqs * self.step

    def steps_to_next_finish(self) -> int:
        return self._heap[0][0] - self.step

    def advance(self, steps: int) -> list[tuple[DecodeBatch, SeqState]]:
        """Run `steps` steps (at most up to the next finish); the (batch, sequence) pairs that
        finished, by rank then request id (they all finish at the same step)."""
        assert 0 < steps <= self.steps_to_next_finish()
        self.step += steps
        heap, done = self._heap, []
        while heap and heap[0][0] <= self.step:
            _, _, _, seq, batch = heapq.heappop(heap)
            batch._leave(seq)
            done.append((batch, seq))
        return done

    def _add(self, rank: int, seqs: int, base: int) -> None:
        before = self.counts[rank]
        self.counts[rank] = before + seqs
        self.seqs += seqs
        self._base += base
        self.active += (self.counts[rank] > 0) - (before > 0)


class DecodeBatch:
    def __init__(self, clock: DecodeClock | None = None, rank: int = 0) -> None:
        self.clock = clock if clock is not None else DecodeClock()
        self.rank = rank
        self.seqs: dict[int | str, SeqState] = {}  # req_id -> sequence, in join order
        self._base = 0  # this batch's share of the clock's base
        self._synced: dict[int | str, int] = {}  # req_id -> step its counters were last brought up to

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def step(self) -> int:
        return self.clock.step

    @property
    def context_tokens(self) -> int:
        """Sum of the running sequences' context (KV tokens)."""
        return self._base + len(self.seqs) * self.clock.step

    def join(self, seq: SeqState) -> None:
        assert seq.decode_left > 0 and seq.req_id not in self.seqs
        clock = self.clock
        step = clock.step
        self.seqs[seq.req_id] = seq
        self._synced[seq.req_id] = step
        base = seq.computed_tokens - step
        self._base += base
        clock._add(self.rank, 1, base)
        heapq.heappush(clock._heap, (step + seq.decode_left, self.rank, seq.req_id, seq, self))

    def steps_to_next_finish(self) -> int:
        """Steps until this batch's next finish (with a shared clock: the clock's next finish)."""
        return self.clock.steps_to_next_finish()

    def advance(self, steps: int) -> list[SeqState]:
        """Run `steps` steps (at most up to the next finish); return the sequences that finished.
        With a shared clock, use `clock.advance` (it moves every batch of the clock)."""
        return [seq for _, seq in self.clock.advance(steps)]

    def sync(self) -> list[SeqState]:
        """Bring every running sequence's counters up to date; return them in join order."""
        for seq in self.seqs.values():
            self._sync_one(seq)
        return list(self.seqs.values())

    def _leave(self, seq: SeqState) -> None:
        self._sync_one(seq)
        del self.seqs[seq.req_id], self._synced[seq.req_id]
        base = seq.computed_tokens - self.clock.step
        self._base -= base
        self.clock._add(self.rank, -1, -base)

    def _sync_one(self, seq: SeqState) -> None:
        delta = self.clock.step - self._synced[seq.req_id]
        seq.computed_tokens += delta
        seq.generated += delta
        self._synced[seq.req_id] = self.clock.step
