"""AgentX replay of recorded conversations as a closed-loop ArrivalSource (start / on_done).

    convs = read_conversations(spec.trace)               # rackserve.workload.trace_file
    src = TraceReplaySource(convs, spec, block_size=64)  # spec: AgentXTraceWorkload
    reqs = src.start(); ...; more = src.on_done(req, now_s)
    src.stats()   # ReplayStats: requests, warm-ups, overflows, overflow share, valid (<= 1 %)

Rules (data/agentx/README.md, SemiAnalysis AgentX):
- `concurrency` lanes; each replays one conversation tree (parent + subagents) at a time and
  draws the next conversation (seeded shuffle, reshuffled each pass) once the whole tree drained.
- An initial lane picks t* = u * duration, u ~ U(start_ratio_min, start_ratio_max) on the parent's
  recorded clock, sends the parent turn just before t* as warm-up (`Request.warmup`), and goes on
  from the step after it. A recycled lane starts its conversation at turn 0, at once.
- Every idle gap is replayed end-to-start: recorded think time (or, after a join, the recorded
  gap after the last gating subagent ended), capped at `think_time_cap_s`.
- A fan-out starts all its subagents when the parent's previous turn ends; they run in the lane in
  parallel; the parent's next turn waits for the completed-status ones only.
- Output length = recorded (>= 1), no truncation. A request whose prompt + output exceeds
  `max_context` is not sent: it counts as an overflow and ends its tree (AgentX: an overflow is
  terminal for the session); the lane recycles once the tree's in-flight requests are done.
- `warmup_first` (AgentX's order, off by default): the warm-up turns are all sent at 0 and every
  lane holds (a lane without a warm-up holds its turn 0) until the last warm-up has finished; then
  all lanes go on at once, at `released_at_s`, and `duration_s` counts from there (the simulator
  moves its measured window by the same amount), so the window opens on warm caches and drained
  queues instead of the warm-up burst.
- Cache bust: one 64-bit salt per replay (lane, replay number) goes into every block id, so
  concurrent replays of a conversation share nothing, while a tree's own turns and subagents share
  whatever the trace's hash ids share.

Request fields: `session` = replay number (unique per tree), `turn` = parent step index, or
1000 * (subagent ordinal + 1) + its turn index; `lane`; `warmup`; `block_hashes` (a sequence of ints
at the target block size, converted where read: trace_blocks.BlockHashes) and `block_hash_array` (the same ids as uint64). `turn_ref(req_id)` gives the
(turn, salt, tail) of a request in flight so a live client can build its prompt tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from rackserve.workload.conversation import Conversation, FanOut, Turn
from rackserve.workload.lanes import lane_start
from rackserve.workload.request import Request
from rackserve.workload.spec import AgentXTraceWorkload
from rackserve.workload.tokens import content_id
from rackserve.workload.trace_blocks import BlockIds, next_block_ids

MAX_OVERFLOW_SHARE = 0.01  # AgentX: a run is invalid above 1 % context overflows
SUBAGENT_TURN_BASE = 1000


@dataclass(frozen=True)
class ReplayStats:
    requests: int  # sent, warm-ups included
    warmups: int
    overflows: int  # not sent: prompt + output > max_context

    @property
    def overflow_share(self) -> float:
        total = self.requests + self.overflows
        return self.overflows / total if total else 0.0

    @property
    def valid(self) -> bool:
        return self.overflow_share <= MAX_OVERFLOW_SHARE


@dataclass(frozen=True)
class TurnRef:
    """What a request in flight replays: enough for a live client to synthesize its tokens."""

    turn: Turn
    salt: int
    tail: int
    prompt_tokens: int  # scaled
    output_tokens: int  # scaled


_Agent = tuple[int, int] | None  # None: the parent; (fan-out step, subagent index)


@dataclass
class _Tree:
    lane: int
    conv: Conversation
    replay: int
    salt: int
    step: int = 0  # the parent's current step
    waiting: int = 0  # gating subagents still running
    outstanding: int = 0  # requests handed out, not yet done
    parent_done: bool = False
    dead: bool = False  # overflowed
    drained: bool = False
    last_ids: dict[_Agent, BlockIds] = field(default_factory=dict)  # each agent's previous request


class TraceReplaySource:
    def __init__(self, conversations: Sequence[Conversation], spec: AgentXTraceWorkload,
                 block_size: int = 64, model_id: str = "deepseek-v4.1-flash") -> None:  # fmt: skip
        if not conversations:
            raise ValueError("trace: no conversations to replay")
        self.convs = list(conversations)
        self.spec = spec
        self.block_size = block_size
        self.model_id = model_id
        self._order_rng = np.random.default_rng([spec.seed, 0x7A])
        self._order: list[int] = []
        self._live: dict[int, tuple[_Tree, _Agent, int]] = {}
        self._next_req = 0
        self._replays = 0
        self._sent = self._warm = self._overflow = 0
        self._ordinals = [self._subagent_ordinals(c) for c in self.convs]
        self._conv_index = {id(c): i for i, c in enumerate(self.convs)}
        self._t0 = 0.0  # what duration_s counts from: 0, or the warm-up barrier's release
        # when the lanes went on: 0 without warmup_first, else None until the last warm-up finished
        self.released_at_s: float | None = None if spec.warmup_first else 0.0
        self._holding = spec.warmup_first  # before the release: lanes wait instead of going on
        self._warm_open = 0  # warm-ups in flight
        self._held: list[tuple[_Tree, bool]] = []  # (tree, its warm-up is done: go on, else launch)

    # ---- ArrivalSource ----------------------------------------------------------------------------
    def start(self) -> list[Request]:
        s = self.spec
        out: list[Request] = []
        for lane in range(s.concurrency):
            rng = np.random.default_rng([s.seed, lane])
            at = float(rng.uniform(0.0, s.start_stagger_s)) if s.start_stagger_s else 0.0
            opens = 0.0 if s.lanes_schedule is None else lane_start(s.lanes_schedule, lane, 0.0)
            if opens is None:
                continue
            tree = self._new_tree(lane, self._next_conv())
            if opens > 0.0:  # opened later by the schedule: a new session, at turn 0
                out += self._launch_or_recycle(tree, opens)
                continue
            warm = self._warmup_step(tree.conv, float(rng.uniform(s.start_ratio_min, s.start_ratio_max)))
            if warm is None:
                out += self._launch_or_recycle(tree, at)
                continue
            tree.step = warm
            out += self._send(tree, tree.conv.steps[warm], None, warm, at, warmup=True)
            out += self._recycle_if_drained(tree, at)
        if self._holding and not self._warm_open:
            out += self._release(0.0)  # nothing to wait for
        return out

    def on_done(self, request: Request, now_s: float) -> list[Request]:
        entry = self._live.pop(request.req_id, None)
        if entry is None:
            return []
        tree, agent, index = entry
        tree.outstanding -= 1
        if self._holding and request.warmup:
            self._warm_open -= 1
            self._held.append((tree, True))
            return self._release(now_s) if not self._warm_open else []
        out: list[Request] = []
        if not tree.dead:
            out = self._parent_next(tree, now_s) if agent is None else self._subagent_next(tree, agent, index, now_s)
        return out + self._recycle_if_drained(tree, now_s)

    # ---- queries ----------------------------------------------------------------------------------
    def stats(self) -> ReplayStats:
        return ReplayStats(self._sent, self._warm, self._overflow)

    def turn_ref(self, req_id: int) -> TurnRef:
        tree, agent, index = self._live[req_id]
        turn = self._turn(tree, agent, index)
        return TurnRef(turn, tree.salt, self._tail(tree, agent, index), *self._lengths(turn))

    def _release(self, now: float) -> list[Request]:
        """warmup_first: the last warm-up is done; every held lane goes on (or starts) at `now`."""
        self._holding, self._t0, self.released_at_s = False, now, now
        out: list[Request] = []
        for tree, warmed in self._held:
            if warmed:
                out += self._parent_next(tree, now) if not tree.dead else []
                out += self._recycle_if_drained(tree, now)
            else:
                out += self._launch_or_recycle(tree, now)
        self._held = []
        return out

    # ---- lanes and trees --------------------------------------------------------------------------
    def _next_conv(self) -> Conversation:
        if not self._order:
            self._order = self._order_rng.permutation(len(self.convs)).tolist()[::-1]
        return self.convs[self._order.pop()]

    def _new_tree(self, lane: int, conv: Conversation) -> _Tree:
        replay = self._replays
        self._replays += 1
        salt = content_id("agentx-trace", self.model_id, self.spec.seed, lane, replay)
        return _Tree(lane, conv, replay, salt)

    @staticmethod
    def _warmup_step(conv: Conversation, u: float) -> int | None:
        """Step index of the parent turn just before t* = u * duration (None: start at turn 0)."""
        turns = conv.parent_turns
        t0 = conv.steps[turns[0]].t_s
        t_star = t0 + u * conv.duration_s
        before = [i for i in turns if conv.steps[i].t_s < t_star]
        return before[-1] if before else None

    def _launch_or_recycle(self, tree: _Tree, at: float) -> list[Request]:
        """Start `tree` at turn 0; trees whose first turn overflows are replaced at once."""
        if self._holding:
            self._held.append((tree, False))
            return []
        for _ in range(len(self.convs) + 1):
            out = self._advance_parent(tree, at)
            if not tree.dead or tree.outstanding:
                return out
            tree.drained = True
            tree = self._new_tree(tree.lane, self._next_conv())
        raise ValueError(f"max_context: {self.spec.max_context} tokens is too small for every "
                         "conversation's first request")  # fmt: skip

    def _recycle_if_drained(self, tree: _Tree, now: float) -> list[Request]:
        if tree.drained or tree.outstanding or not (tree.dead or (tree.parent_done and not tree.waiting)):
            return []
        tree.drained = True
        at = now if self.spec.lanes_schedule is None else lane_start(self.spec.lanes_schedule, tree.lane, now)
        if at is None or at >= self._t0 + self.spec.duration_s:
            return []
        return self._launch_or_recycle(self._new_tree(tree.lane, self._next_conv()), at)

    # ---- the parent and its subagents -------------------------------------------------------------
    def _parent_next(self, tree: _Tree, now: float) -> list[Request]:
        tree.step += 1
        return self._advance_parent(tree, now)

    def _advance_parent(self, tree: _Tree, now: float) -> list[Request]:
        """Send the parent's current step (a turn, or a fan-out followed by what does not wait)."""
        steps = tree.conv.steps
        out: list[Request] = []
        while tree.step < len(steps) and not tree.dead:
            step = steps[tree.step]
            if isinstance(step, Turn):
                at = now + min(self.spec.think_time_cap_s, step.idle_before_s)
                return out + self._send(tree, step, None, tree.step, at)
            out += self._fan_out(tree, step, now)
            if tree.waiting:
                return out
            tree.step += 1  # only async subagents: the parent goes on
        tree.parent_done = True
        return out

    def _fan_out(self, tree: _Tree, fan: FanOut, now: float) -> list[Request]:
        out: list[Request] = []
        for k, sub in enumerate(fan.subagents):
            if not sub.turns or tree.dead:
                continue
            tree.waiting += sub.gates
            out += self._send(tree, sub.turns[0], (tree.step, k), 0, now)
        return out

    def _subagent_next(self, tree: _Tree, agent: tuple[int, int], index: int, now: float) -> list[Request]:
        step, k = agent
        sub = tree.conv.steps[step].subagents[k]
        if index + 1 < len(sub.turns):
            turn = sub.turns[index + 1]
            return self._send(tree, turn, agent, index + 1, now + min(self.spec.think_time_cap_s, turn.idle_before_s))
        if not sub.gates:
            return []
        tree.waiting -= 1
        return self._parent_next(tree, now) if tree.waiting == 0 else []

    # ---- requests ---------------------------------------------------------------------------------
    def _lengths(self, turn: Turn) -> tuple[int, int]:
        s = self.spec.length_scale
        if s == 1.0:
            return turn.prompt_tokens, turn.output_tokens
        return max(1, round(turn.prompt_tokens * s)), max(1, round(turn.output_tokens * s))

    def _turn(self, tree: _Tree, agent: _Agent, index: int) -> Turn:
        if agent is None:
            return tree.conv.steps[index]
        return tree.conv.steps[agent[0]].subagents[agent[1]].turns[index]

    def _turn_number(self, tree: _Tree, agent: _Agent, index: int) -> int:
        if agent is None:
            return index
        ordinal = self._ordinals[self._conv_index[id(tree.conv)]][agent]
        return SUBAGENT_TURN_BASE * (ordinal + 1) + index

    def _tail(self, tree: _Tree, agent: _Agent, index: int) -> int:
        return (tree.salt ^ (self._turn_number(tree, agent, index) * 0x9E3779B1)) & ((1 << 63) - 1)

    @staticmethod
    def _subagent_ordinals(conv: Conversation) -> dict[tuple[int, int], int]:
        keys = [(i, k) for i, s in enumerate(conv.steps) if isinstance(s, FanOut) for k in range(len(s.subagents))]
        return {key: n for n, key in enumerate(keys)}

    def _send(self, tree: _Tree, turn: Turn, agent: _Agent, index: int, at: float,
              warmup: bool = False) -> list[Request]:  # fmt: skip
        if at >= self._t0 + self.spec.duration_s:
            return []
        prompt, output = self._lengths(turn)
        if prompt + output > self.spec.max_context:
            self._overflow += 1
            tree.dead = True
            return []
        prev = tree.last_ids.get(agent)  # the agent's previous turn (agents send in order)
        ids = next_block_ids(prev, turn.hash_ids, tree.salt, prompt, self.block_size, self.spec.length_scale,
                             self._tail(tree, agent, index), turn.shared_ids)  # fmt: skip
        tree.last_ids[agent] = ids
        req = Request(self._next_req, at, prompt, output, ids.as_tuple, session=tree.replay,
                      turn=self._turn_number(tree, agent, index), lane=tree.lane, warmup=warmup,
                      block_hash_array=ids.ids)  # fmt: skip
        self._next_req += 1
        self._sent += 1
        self._warm += warmup
        self._warm_open += warmup
        tree.outstanding += 1
        self._live[req.req_id] = (tree, agent, index)
        return [req]
