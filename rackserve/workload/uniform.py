"""Closed-loop requests of one shape (e.g. a batch-1 latency probe): `concurrency` lanes, back to back."""

from __future__ import annotations

from rackserve.workload.request import Request
from rackserve.workload.spec import UniformWorkload
from rackserve.workload.tokens import HashChain, content_id


class UniformSource:
    def __init__(self, spec: UniformWorkload, block_size: int = 64, model_id: str = "deepseek-v4.1-flash") -> None:
        self.spec = spec
        self.block_size = block_size
        self.model_id = model_id
        self._issued = 0

    def start(self) -> list[Request]:
        lanes = min(self.spec.concurrency, self.spec.requests)
        return [self._make(0.0) for _ in range(lanes)]

    def on_done(self, request: Request, now_s: float) -> list[Request]:
        return [self._make(now_s)] if self._issued < self.spec.requests else []

    def _make(self, at: float) -> Request:
        s = self.spec
        chain = HashChain(self.block_size, self.model_id)
        shared = min(s.shared_prefix_tokens, s.prompt_tokens)
        chain.extend_content(content_id("shared", s.seed), shared)
        chain.extend_content(content_id("prompt", s.seed, self._issued), s.prompt_tokens - shared)
        req = Request(self._issued, at, s.prompt_tokens, s.output_tokens, tuple(chain.hashes))
        self._issued += 1
        return req
