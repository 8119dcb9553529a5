"""Closed-loop requests of one shape (e.g. a batch-1 latency probe): `concurrency` lanes, back to back.
With `length_spread` s, each prompt and output length is drawn uniformly from [(1 - s) L, L], seeded,
as InferenceX's random dataset draws them (benchmark_serving --random-range-ratio 0.8: 80-100%).
With `lanes_schedule`, lane i runs while the schedule has more than i lanes: a lane that finishes when
the schedule has dropped below it waits for the next time the schedule reaches it again."""

from __future__ import annotations

import numpy as np

from rackserve.workload.lanes import lane_start
from rackserve.workload.request import Request
from rackserve.workload.spec import UniformWorkload
from rackserve.workload.tokens import HashChain, content_id


class UniformSource:
    def __init__(self, spec: UniformWorkload, block_size: int = 64, model_id: str = "deepseek-v4.1-flash") -> None:
        self.spec = spec
        self.block_size = block_size
        self.model_id = model_id
        self._issued = 0
        self._rng = np.random.default_rng(spec.seed)
        self._lane: dict[int, int] = {}  # req_id -> lane (with a lanes schedule)

    def start(self) -> list[Request]:
        sched = self.spec.lanes_schedule
        if sched is None:
            lanes = min(self.spec.concurrency, self.spec.requests)
            return [self._make(0.0) for _ in range(lanes)]
        out = []
        for lane in range(max(n for _, n in sched)):
            at = lane_start(sched, lane, 0.0)
            if at is not None and self._issued < self.spec.requests:
                out.append(self._on_lane(lane, at))
        return out

    def on_done(self, request: Request, now_s: float) -> list[Request]:
        if self._issued >= self.spec.requests:
            return []
        sched = self.spec.lanes_schedule
        if sched is None:
            return [self._make(now_s)]
        lane = self._lane.pop(request.req_id)
        at = lane_start(sched, lane, now_s)
        return [] if at is None else [self._on_lane(lane, at)]

    def _on_lane(self, lane: int, at: float) -> Request:
        req = self._make(at)
        self._lane[req.req_id] = lane
        return req

    def _make(self, at: float) -> Request:
        s = self.spec
        chain = HashChain(self.block_size, self.model_id)
        prompt, output = self._lengths()
        shared = min(s.shared_prefix_tokens, prompt)
        chain.extend_content(content_id("shared", s.seed), shared)
        chain.extend_content(content_id("prompt", s.seed, self._issued), prompt - shared)
        req = Request(self._issued, at, prompt, output, tuple(chain.hashes))
        self._issued += 1
        return req

    def _lengths(self) -> tuple[int, int]:
        s = self.spec
        if s.length_spread == 0.0:
            return s.prompt_tokens, s.output_tokens
        lo = 1.0 - s.length_spread
        p, o = self._rng.uniform(lo, 1.0, size=2)
        return max(1, round(p * s.prompt_tokens)), max(1, round(o * s.output_tokens))
