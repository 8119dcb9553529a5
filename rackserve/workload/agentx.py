"""AgentX-like agentic load: `concurrency` lanes each run multi-turn coding sessions back to back.

A session resends its whole growing conversation each turn (shared system prompt + tool
definitions, user task, then model outputs and tool outputs), waits a think time between turns,
and now and then spawns a subagent (one level deep) that starts from the parent's context. Everything is drawn
from numpy generators seeded by (seed, session), so the same seed gives the same sessions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rackserve.workload.request import Request
from rackserve.workload.spec import AgentXWorkload
from rackserve.workload.tokens import HashChain, content_id


@dataclass
class _Session:
    sid: int
    chain: HashChain
    turns_left: int
    rng: np.random.Generator
    turn: int = 0
    subagents: int = 0
    parent: _Session | None = None


@dataclass
class _Lane:
    stack: list[_Session] = field(default_factory=list)


class AgentXSource:
    """Closed-loop ArrivalSource over an AgentXWorkload spec."""

    def __init__(self, spec: AgentXWorkload, block_size: int = 64, model_id: str = "deepseek-v4.1-flash") -> None:
        self.spec = spec
        self.block_size = block_size
        self.model_id = model_id
        self._next_session = 0
        self._next_req = 0
        self._lanes = [_Lane() for _ in range(spec.concurrency)]
        self._lane_of: dict[int, int] = {}
        self._prefixes: dict[int, HashChain] = {}

    def start(self) -> list[Request]:
        rng = np.random.default_rng([self.spec.seed, 1 << 30])
        offsets = np.sort(rng.uniform(0.0, self.spec.start_stagger_s, self.spec.concurrency))
        out = []
        for lane_id, t0 in enumerate(offsets):
            req = self._next_session_request(lane_id, float(t0))
            if req is not None:
                out.append(req)
        return out

    def on_done(self, request: Request, now_s: float) -> list[Request]:
        lane_id = self._lane_of.pop(request.req_id)
        lane = self._lanes[lane_id]
        sess = lane.stack[-1]
        sess.chain.extend_content(content_id("output", self.spec.seed, sess.sid, sess.turn), request.output_tokens)
        sess.turn += 1
        sess.turns_left -= 1
        at = now_s + float(sess.rng.exponential(self.spec.think_time_mean_s)) if self.spec.think_time_mean_s else now_s
        if self.spec.duration_s is not None and at >= self.spec.duration_s:
            lane.stack.clear()
            return []
        if sess.turns_left <= 0:
            lane.stack.pop()
            if not lane.stack:
                req = self._next_session_request(lane_id, at)
                return [req] if req is not None else []
            self._append_tool_output(lane.stack[-1])  # the subagent's result
        elif sess.parent is None and sess.rng.random() < self.spec.subagent_probability:
            lane.stack.append(self._spawn_subagent(sess))
        else:
            self._append_tool_output(sess)
        return [self._request(lane_id, lane.stack[-1], at)]

    def _next_session_request(self, lane_id: int, at: float) -> Request | None:
        if self._next_session >= self.spec.sessions:
            return None
        if self.spec.duration_s is not None and at >= self.spec.duration_s:
            return None
        sess = self._new_session(self._next_session)
        self._next_session += 1
        self._lanes[lane_id].stack = [sess]
        return self._request(lane_id, sess, at)

    def _new_session(self, sid: int) -> _Session:
        s = self.spec
        rng = np.random.default_rng([s.seed, sid])
        variant = int(rng.integers(s.system_prompt_variants))
        chain = self._shared_prefix(variant).fork()
        chain.extend_content(content_id("user", s.seed, sid), s.first_user_tokens)
        turns = int(rng.integers(s.turns_min, s.turns_max + 1))
        return _Session(sid, chain, turns, rng)

    def _shared_prefix(self, variant: int) -> HashChain:
        """System prompt + tool definitions of one variant, hashed once and forked per session."""
        chain = self._prefixes.get(variant)
        if chain is None:
            s = self.spec
            chain = HashChain(self.block_size, self.model_id)
            chain.extend_content(content_id("system", s.seed, variant), s.system_prompt_tokens)
            chain.extend_content(content_id("tools", s.seed, variant), s.tool_defs_tokens)
            self._prefixes[variant] = chain
        return chain

    def _spawn_subagent(self, parent: _Session) -> _Session:
        s = self.spec
        parent.subagents += 1
        chain = parent.chain.fork()
        chain.extend_content(content_id("subtask", s.seed, parent.sid, parent.subagents), s.subagent_task_tokens)
        turns = int(parent.rng.integers(s.subagent_turns_min, s.subagent_turns_max + 1))
        sub_rng = np.random.default_rng([s.seed, parent.sid, parent.subagents])
        return _Session(parent.sid, chain, turns, sub_rng, parent=parent, turn=1000 * parent.subagents)

    def _append_tool_output(self, sess: _Session) -> None:
        s = self.spec
        n = int(sess.rng.integers(s.tool_output_tokens_min, s.tool_output_tokens_max + 1))
        sess.chain.extend_content(content_id("tool", s.seed, sess.sid, sess.turn), n)

    def _request(self, lane_id: int, sess: _Session, at: float) -> Request:
        req = Request(self._next_req, at, sess.chain.length, self.spec.output_tokens,
                      tuple(sess.chain.hashes), session=sess.sid, turn=sess.turn)
        self._next_req += 1
        self._lane_of[req.req_id] = lane_id
        return req
