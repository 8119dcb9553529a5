"""A rank's running decode batch with lazy counters, so leaping k steps costs O(finished log n).

Every running sequence gains one token per step. Instead of touching each sequence per step, the
batch counts its own steps; a sequence's counters are brought up to date (`sync`) only when it
finishes or someone needs them. A heap keyed by the step a sequence finishes gives the next finish
in O(1), and the batch keeps its total context so the cost model needs no per-sequence walk.
"""

from __future__ import annotations

import heapq

from rackserve.sched.seq_state import SeqState


class DecodeBatch:
    def __init__(self) -> None:
        self.step = 0  # decode steps this rank has run
        self.seqs: dict[int, SeqState] = {}  # req_id -> sequence, in join order
        self.context_tokens = 0  # sum of running sequences' context (KV tokens)
        self._heap: list[tuple[int, int, SeqState]] = []  # (finish step, req_id, seq)
        self._synced: dict[int, int] = {}  # req_id -> step its counters were last brought up to

    def __len__(self) -> int:
        return len(self.seqs)

    def join(self, seq: SeqState) -> None:
        assert seq.decode_left > 0 and seq.req_id not in self.seqs
        self.seqs[seq.req_id] = seq
        self._synced[seq.req_id] = self.step
        self.context_tokens += seq.computed_tokens
        heapq.heappush(self._heap, (self.step + seq.decode_left, seq.req_id, seq))

    def steps_to_next_finish(self) -> int:
        return self._heap[0][0] - self.step

    def advance(self, steps: int) -> list[SeqState]:
        """Run `steps` steps (at most up to the next finish); return the sequences that finished."""
        assert 0 < steps <= self.steps_to_next_finish()
        self.step += steps
        self.context_tokens += steps * len(self.seqs)
        done = []
        while self._heap and self._heap[0][0] <= self.step:
            _, req_id, seq = heapq.heappop(self._heap)
            self._sync_one(seq)
            del self.seqs[req_id], self._synced[req_id]
            self.context_tokens -= seq.computed_tokens
            done.append(seq)
        return done

    def sync(self) -> list[SeqState]:
        """Bring every running sequence's counters up to date; return them in join order."""
        for seq in self.seqs.values():
            self._sync_one(seq)
        return list(self.seqs.values())

    def _sync_one(self, seq: SeqState) -> None:
        delta = self.step - self._synced[seq.req_id]
        seq.computed_tokens += delta
        seq.generated += delta
        self._synced[seq.req_id] = self.step
