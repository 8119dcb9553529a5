"""The decode side of the simulator: P/D hand-off, decode batches that leap over identical steps until
the next event, and bounded-KV decode ranks that step one scheduled step at a time (preemption).

A mixin of rackserve.sim.simulator.Simulator: it uses the simulator's decode instances, clock,
metrics and routing state, and gives finished requests back through `_finish`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rackserve.kv.block_cache import BlockCache
from rackserve.sched.kv_ledger import KVLedger, SyntheticIdentity
from rackserve.sched.seq_state import SeqState
from rackserve.sim.decode_load import DecodeLoad
from rackserve.sim.events import DecodeLeapEnd, Event
from rackserve.sim.instances import Leap
from rackserve.sim.metrics import Flight
from rackserve.timing.batch import RankBatch, StepBatch
from rackserve.timing.speculative import request_acceptance
from rackserve.workload.request import Request

EMPTY_RANK = RankBatch.of([])


def _decode_rank_batch(seqs: int, context_tokens: int, extra: int, tail: int = 0) -> RankBatch:
    """A decode rank's step as the cost model sees it: `seqs` sequences sharing the batch's total
    context evenly (exact for costs linear in context), each `extra` tokens further along; `tail`
    tokens of that context not cached yet but computed in this step (newcomers' partial last blocks)."""
    if seqs == 0:
        return EMPTY_RANK
    context_tokens -= tail
    cached = np.full(seqs, context_tokens // seqs + extra, dtype=np.int64)
    cached[: context_tokens % seqs] += 1
    new = np.ones(seqs, dtype=np.int64)
    new[0] += tail
    return RankBatch(new, cached)


def _drop_event(_: object) -> None:
    """Decode-rank KV events are not routed on: the simulator discards them."""


class DecodeSide:
    """Decode-side handlers and helpers of the Simulator (see the module docstring)."""

    def _decode_kv_override(self, group: int = 0) -> int | None:
        """KV tokens per rank of decode group `group` when its ranks count blocks (vLLM's paged
        admission: a sequence joins while free blocks hold its context, running out preempts the
        newest): sim.decode_kv_tokens_per_rank when the scenario sets it, the derived budget with
        sim.decode_paged; otherwise None: the lazy batch admits by KV tokens too, but reserves each
        request's whole output up front (so it never preempts)."""
        sim = self.scenario.sim
        if "decode_kv_tokens_per_rank" in sim.model_fields_set:
            return sim.decode_kv_tokens_per_rank
        return self.sizing.decode_kv_tokens[group] if sim.decode_paged else None

    def _decode_group(self, idx: int) -> int:
        """The deployment's decode group of decode instance `idx` (instances are built group by group)."""
        for g, group in enumerate(self.scenario.config.deployment.decode):
            if idx < group.count:
                return g
            idx -= group.count
        raise AssertionError("decode instance beyond the deployment's groups")

    def _decode_ledger(self, group: int = 0) -> KVLedger | None:
        """A decode rank's KV blocks (target block size) when its capacity is bounded: running out
        preempts (recompute) instead of reserving every output up front."""
        tokens = self._decode_kv_override(group)
        if tokens is None:
            return None
        bs = self.target_block_tokens
        cache = BlockCache(max(1, tokens // bs), bs, on_event=_drop_event)
        return KVLedger(cache, SyntheticIdentity(bs))

    def on_kv_arrive(self, now: float, flight: Flight) -> list[Event]:
        req = flight.request
        flight.kv_arrive = now
        d_idx, rank = flight.decode
        # The prompt's full blocks arrived; the first token is known (from prefill) and not yet in
        # KV. As in the live twin, the first decode step recomputes the prompt's partial last block
        # with it: a bounded rank's scheduler computes it from `computed_tokens`; the lazy batch keeps
        # the whole prompt as context and its first leap step prices the tail (`_tails`).
        handed = req.prompt_tokens - self._tail(req) if self._bounded(d_idx) else req.prompt_tokens
        seq = SeqState(req.req_id, req.prompt_tokens + 1, self._decode_steps(req), computed_tokens=handed,
                       payload=flight)
        if not self._fits_decode_kv(req, d_idx) or not self.decode[d_idx].ranks[rank].admit(seq):
            self.metrics.rejected += 1
            self._release_decode(flight)
            return self._followups(req, now)
        self._decode_waiting[d_idx].add(rank)
        self.idle_watch.changed(now, "decode", d_idx)
        return self._kick_decode(now, d_idx)

    def _decode_steps(self, req: Request) -> int:
        """Lazy-clock tokens the request decodes: its output tokens, or with `acceptance: sampled`
        its output at its own acceptance (drawn over its steps) in tokens of the mean acceptance,
        so a request that accepts more finishes in fewer steps of the shared clock."""
        spec = getattr(self.timing, "speculation", None)
        if spec is None or self.scenario.config.timing.speculative.acceptance != "sampled":
            return req.output_tokens
        if getattr(self, "_acceptance_rng", None) is None:
            self._acceptance_rng = np.random.default_rng([getattr(self.scenario.workload, "seed", 0), 31])
        mean = spec.expected_accepted_tokens
        own = request_acceptance(spec, math.ceil(req.output_tokens / mean), self._acceptance_rng)
        return max(1, round(req.output_tokens * mean / own))

    def _tail(self, req: Request) -> int:
        """Prompt tokens past its last full block: KV the hand-off does not move."""
        return req.prompt_tokens % self.target_block_tokens

    def _fits_decode_kv(self, req: Request, idx: int) -> bool:
        """A request whose whole context cannot fit a decode rank's KV alone would never finish."""
        cap = self._decode_kv_override(self._decode_group(idx))
        return cap is None or req.prompt_tokens + req.output_tokens <= cap

    def _kick_decode(self, now: float, idx: int) -> list[Event]:
        """New work for a decode instance: start a leap if idle, else cut the current leap short at
        the next step boundary so the newcomer joins the batch there (a bounded-KV instance's first
        step is already scheduled, so its leap keeps at least that step)."""
        leap = self._leaps[idx]
        if leap is None:
            return self._start_leap(now, idx)
        if leap.head is not None:
            return self._kick_headed(now, idx, leap)
        done = math.ceil((now - leap.start) / leap.step_s - 1e-9)
        if self._bounded(idx):
            done = max(done, 1)
        if done >= leap.steps:
            return []
        self._versions[idx] += 1
        if done <= 0:
            self._leaps[idx] = None
            return self._start_leap(now, idx, leap.joined)
        self._leaps[idx] = Leap(leap.start, done, leap.step_s, leap.cost, self._versions[idx], leap.joined)
        return [DecodeLeapEnd(leap.start + done * leap.step_s, idx, self._versions[idx])]

    def _kick_headed(self, now: float, idx: int, leap: Leap) -> list[Event]:
        """_kick_decode on a leap led by a tail step (`_start_leap`): the same cuts as when the
        tail step was a leap of its own and the body the next one."""
        head = leap.head
        if now < leap.start:  # in the tail step: it ends as planned, the body is cut
            self._versions[idx] += 1
            if math.ceil((now - leap.head_start) / head.total_s - 1e-9) <= 0:
                self._leaps[idx] = None
                return self._start_leap(now, idx, leap.joined)
            self._leaps[idx] = Leap(leap.head_start, 1, head.total_s, head, self._versions[idx], leap.joined)
            return [DecodeLeapEnd(leap.start, idx, self._versions[idx])]
        done = math.ceil((now - leap.start) / leap.step_s - 1e-9)
        if done >= leap.steps:
            return []
        self._versions[idx] += 1
        if done <= 0:  # at the body's start: the tail step is over, the body starts again with the newcomer
            self._leaps[idx] = None
            self._end_head(idx, leap)
            return self._start_leap(now, idx)
        self._leaps[idx] = Leap(leap.start, done, leap.step_s, leap.cost, self._versions[idx], leap.joined,
                                head, leap.head_start)
        return [DecodeLeapEnd(leap.start + done * leap.step_s, idx, self._versions[idx])]

    def _end_head(self, idx: int, leap: Leap) -> None:
        """A leap's tail step is over (at leap.start): charged, its newcomers' first token made."""
        inst = self.decode[idx]
        inst.account(leap.head, 1)
        for seq in leap.joined:
            seq.payload.first_token = leap.start
        inst.ranks[0].decoding.clock.advance(1)  # no finish: a leap has a body only then

    def _bounded(self, idx: int) -> bool:
        return self.decode[idx].ranks[0].kv is not None

    def _start_decode_step(self, now: float, idx: int) -> list[Event]:
        """A scheduled step of a bounded-KV decode instance (decode tokens, resumed sequences'
        recompute chunks, preemptions); when it is pure decode, a leap over the identical steps
        that follow while the free blocks surely last (priced at the middle step, as the lazy path)."""
        inst = self.decode[idx]
        plans = [sched.schedule() for sched in inst.ranks]
        self.idle_watch.changed(now, "decode", idx)
        self.metrics.preemptions += sum(len(p.preempted) for p in plans)
        if all(p.empty for p in plans):
            inst.busy, self._leaps[idx] = False, None
            return []
        steps = min(s.decode_leap_steps(p) for s, p in zip(inst.ranks, plans, strict=True) if not p.empty)
        mid = (steps - 1) // 2
        batches = [p.rank_batch() for p in plans]
        batches = [RankBatch(b.new_tokens, b.cached_tokens + mid, b.pool_hbm_tokens, b.pool_dram_tokens)
                   for b in batches]
        # per output token: with MTP a pure decode step is a speculative step / its accepted tokens
        cost = self.timing.decode_token_time(inst.layout, StepBatch(tuple(batches)))
        runs = [(sched.seq(s.req_id), s.num_new_tokens) for sched, p in zip(inst.ranks, plans, strict=True)
                for s in p.seqs]
        joined = [seq for seq, n in runs if seq.payload.first_token < 0 and n == seq.pending]  # first sample
        self._versions[idx] += 1
        inst.busy, inst.plans = True, plans
        self._leaps[idx] = Leap(now, steps, cost.total_s, cost, self._versions[idx], joined)
        return [DecodeLeapEnd(now + steps * cost.total_s, idx, self._versions[idx])]

    def _start_leap(self, now: float, idx: int, joined: list | None = None) -> list[Event]:
        if self._bounded(idx):
            return self._start_decode_step(now, idx)
        inst = self.decode[idx]
        joined = list(joined or [])
        waiting = self._decode_waiting[idx]
        if waiting:  # only ranks with waiting sequences can promote (the others would do nothing)
            for r in sorted(waiting):
                sched = inst.ranks[r]
                joined.extend(sched.promote_decode())
                if not sched.waiting:
                    waiting.discard(r)
            if waiting and self._windowed:  # admission waits: the KV budget (or max_num_seqs) is full
                self.decode_load().admission_waits += 1
        self.idle_watch.changed(now, "decode", idx)
        clock = inst.ranks[0].decoding.clock
        if not clock.seqs:
            inst.busy, self._leaps[idx] = False, None
            return []
        tails = self._tails(joined)
        self._versions[idx] += 1
        inst.busy = True
        if tails:  # the newcomers' first step also recomputes their prompts' partial last blocks
            return self._start_headed(now, idx, joined, self._tail_step_cost(inst, tails))
        steps = clock.steps_to_next_finish()
        mid = (steps - 1) // 2  # context grows one token per step: charge the middle step
        cost = self._decode_cost(inst, mid)
        self._leaps[idx] = Leap(now, steps, cost.total_s, cost, self._versions[idx], joined)
        return [DecodeLeapEnd(now + steps * cost.total_s, idx, self._versions[idx])]

    def _start_headed(self, now: float, idx: int, joined: list, head: Any) -> list[Event]:
        """A leap of the tail step `head` and then, when nothing comes between, the identical steps
        up to the next finish (its body): one event where the tail step and the body each were
        one. Its figures are those of the two leaps; it is not folded where the measured window
        starts or ends in it (the two leaps' steps fall on either side), nor without a body."""
        body_start = now + head.total_s  # where the tail step's own leap ended
        steps = self.decode[idx].ranks[0].decoding.clock.steps_to_next_finish() - 1
        if steps > 0 and self._windowed:
            mid = (steps - 1) // 2
            cost = self._decode_cost(self.decode[idx], mid + 1)  # from the state after the tail step
            end = body_start + steps * cost.total_s
            window_end = self.metrics.window_end_s
            if window_end is None or end <= window_end:
                self._leaps[idx] = Leap(body_start, steps, cost.total_s, cost, self._versions[idx], joined, head, now)
                return [DecodeLeapEnd(end, idx, self._versions[idx])]
        self._leaps[idx] = Leap(now, 1, head.total_s, head, self._versions[idx], joined)
        return [DecodeLeapEnd(body_start, idx, self._versions[idx])]

    def _tails(self, joined: list[SeqState]) -> dict[int, int]:
        """Per rank of a lazy decode instance (only those with some): tail tokens its newcomers
        recompute in their first step."""
        tails: dict[int, int] = {}
        for s in joined:
            tail = self._tail(s.payload.request)
            if tail:
                rank = s.payload.decode[1]
                tails[rank] = tails.get(rank, 0) + tail
        return tails

    def _tail_step_cost(self, inst: Any, tails: dict[int, int]) -> Any:
        """The cost of a lazy batch's step in which newcomers compute their tails with the first token."""
        clock = inst.ranks[0].decoding.clock
        counts = clock.counts
        fast = getattr(self.timing, "decode_tail_step_time_of", None)  # CachedTiming: from the totals
        if fast is not None:
            return fast(inst.layout, len(counts), clock.active, clock.seqs, max(counts), clock.context_tokens,
                        list(tails.values()))
        ctx = [inst.ranks[r].decoding.context_tokens if n else 0 for r, n in enumerate(counts)]
        return self.timing.decode_token_time(inst.layout, StepBatch(tuple(
            _decode_rank_batch(n, c, 0, tails.get(r, 0)) for r, (n, c) in enumerate(zip(counts, ctx, strict=True)))))

    def _decode_cost(self, inst: Any, extra: int) -> Any:
        """The per-token cost of the lazy batch of `inst`, each sequence `extra` tokens further."""
        clock = inst.ranks[0].decoding.clock
        fast = getattr(self.timing, "decode_step_time_of", None)  # CachedTiming: from the totals
        if fast is not None:
            return fast(inst.layout, len(clock.counts), clock.active, clock.seqs, max(clock.counts),
                        clock.context_tokens, extra)
        loads = [sched.decode_load() for sched in inst.ranks]
        batch = StepBatch(tuple(_decode_rank_batch(n, ctx, extra) for n, ctx in loads))
        return self.timing.decode_token_time(inst.layout, batch)

    def decode_load(self) -> DecodeLoad:
        """The decode ranks' batch snapshots of the measured window (rackserve/sim/decode_load.py)."""
        load = self.__dict__.get("_decode_load")
        if load is None:
            load = self.__dict__["_decode_load"] = DecodeLoad()
        return load

    def _sample_decode_load(self, now: float) -> None:
        """A snapshot of every decode rank's running sequences (at most one per sampling interval)."""
        load = self.decode_load()
        if not self._windowed or not load.due(now):
            return
        counts: list[int] = []
        held: list[int] = []
        for i, inst in enumerate(self.decode):
            if self._bounded(i):
                counts += [len(sched.running) for sched in inst.ranks]
                held += [sum(seq.computed_tokens for seq in sched.running) for sched in inst.ranks]
            else:
                counts += inst.ranks[0].decoding.clock.counts
                held += [sched.decoding.context_tokens for sched in inst.ranks]
        load.record(now, counts, held)

    def on_decode_leap_end(self, now: float, idx: int, version: int) -> list[Event]:
        leap = self._leaps[idx]
        if leap is None or version != self._versions[idx]:
            return []  # superseded by a shorter leap
        self._sample_decode_load(now)  # the batch the leap ran
        inst = self.decode[idx]
        if leap.head is not None:
            self._end_head(idx, leap)
        else:
            for seq in leap.joined:
                seq.payload.first_token = leap.start + leap.step_s
        inst.account(leap.cost, leap.steps)
        out: list[Event] = []
        if self._bounded(idx):
            for sched, plan in zip(inst.ranks, inst.plans, strict=True):
                ended = sched.update(plan)
                if leap.steps > 1:
                    ended += sched.advance_decode(leap.steps - 1)
                for seq in ended:
                    out.extend(self._finish(now, seq.payload))
        elif inst.ranks[0].decoding.clock.seqs:
            for batch, seq in inst.ranks[0].decoding.clock.advance(leap.steps):  # every rank at once
                inst.ranks[batch.rank].decoded(seq)
                out.extend(self._finish(now, seq.payload))
        self._leaps[idx] = None
        return out + self._start_leap(now, idx)

    def _finish(self, now: float, flight: Flight) -> list[Event]:
        self.metrics.on_finish(flight, now)
        if self.planner is not None:
            self.planner.on_finish(flight, now)
        self._release_decode(flight)
        return self._followups(flight.request, now)

    def _release_decode(self, flight: Flight) -> None:
        d_idx, rank = flight.decode
        self._update_decode((self.decode[d_idx].name, rank), -flight.decode_blocks, -1)
