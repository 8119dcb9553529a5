"""What the benchmark sends: rackserve.workload sources turned into real token-id prompts
(Mooncake traces, recorded conversations replayed by the AgentX rules, AgentX-like sessions).

Arrival times and think times stay in simulated seconds (the runner scales them). Prompts use byte
token ids (0-255) synthesized from content ids, so equal trace hash ids or a session's earlier turns
give equal prompt prefixes, which is what the cluster's prefix caches reuse.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from rackserve.workload.agentx import AgentXSource
from rackserve.workload.mooncake import TRACE_BLOCK_TOKENS, TraceRecord, read_trace
from rackserve.workload.request import Request
from rackserve.workload.source import ArrivalSource, ListSource
from rackserve.workload.spec import AgentXTraceWorkload, AgentXWorkload
from rackserve.workload.tokens import content_id, synth_tokens
from rackserve.workload.trace_blocks import prompt_token_ids
from rackserve.workload.trace_file import read_conversations
from rackserve.workload.trace_replay import ReplayStats, TraceReplaySource

BYTE_VOCAB = 256  # the small model's plain byte ids; special tokens start at 256


class TracePrompts:
    """A Mooncake trace as requests; every length is scaled by `length_scale` (blocks included)."""

    def __init__(self, records: list[TraceRecord], length_scale: float = 1.0) -> None:
        if length_scale <= 0:
            raise ValueError(f"length_scale: must be > 0, got {length_scale}")
        self.records = records
        self.block = max(1, round(TRACE_BLOCK_TOKENS * length_scale))
        self.scale = length_scale

    def requests(self, request_rate: float | None = None, seed: int = 0) -> list[Request]:
        """Trace arrivals, or Poisson arrivals at `request_rate` per simulated second."""
        if request_rate is not None:
            gaps = np.random.default_rng(seed).exponential(1.0 / request_rate, len(self.records))
            arrivals = np.concatenate([[0.0], np.cumsum(gaps)[:-1]]) if len(gaps) else gaps
        else:
            t0 = self.records[0].timestamp_ms if self.records else 0.0
            arrivals = [(r.timestamp_ms - t0) / 1000.0 for r in self.records]
        return [
            Request(
                i, float(at), len(self.prompt(i)), max(1, round(r.output_length * self.scale)), ()
            )
            for i, (r, at) in enumerate(zip(self.records, arrivals, strict=True))
        ]

    def prompt(self, req_id: int) -> list[int]:
        record = self.records[req_id]
        n_total = max(1, math.ceil(record.input_length * self.scale))
        out: list[int] = []
        for hid in record.hash_ids:
            n = min(self.block, n_total - len(out))
            if n <= 0:
                break
            out.extend(synth_tokens(content_id("mooncake", hid), 0, n, BYTE_VOCAB).tolist())
        return out or [0]


class SessionPrompts:
    """Growing conversations for AgentX-like requests: a turn resends its session's earlier prompt.

    Key (session, subagent index): a subagent starts from its parent's conversation.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.convos: dict[tuple[int, int], list[int]] = {}

    def prompt(self, req: Request) -> list[int]:
        key = (req.session, req.turn // 1000)
        convo = self.convos.get(key)
        if convo is None:
            convo = list(self.convos.get((req.session, 0), []))
            self.convos[key] = convo
        if len(convo) > req.prompt_tokens:
            del convo[req.prompt_tokens :]
        need = req.prompt_tokens - len(convo)
        if need > 0:
            cid = content_id("bench", self.seed, req.session, key[1], req.turn)
            convo.extend(synth_tokens(cid, 0, need, BYTE_VOCAB).tolist())
        return list(convo)


def replay_prompt(source: TraceReplaySource, req: Request) -> list[int]:
    """The byte-token prompt of a replayed request in flight: its trace blocks' tokens, salted by
    its lane replay, so the live engine's prefix cache sees the trace's real prefix reuse."""
    ref = source.turn_ref(req.req_id)
    toks = prompt_token_ids(ref.turn.hash_ids, ref.salt, req.prompt_tokens, source.spec.length_scale,
                            ref.tail, BYTE_VOCAB)  # fmt: skip
    return toks.tolist()


class BenchWorkload:
    """An ArrivalSource, the prompt of each of its requests, and their count when known upfront.
    `stats` (trace replay only): the replay's ReplayStats (overflows that were never sent)."""

    def __init__(self, source: ArrivalSource, prompt_of: Callable[[Request], list[int]],
                 total: int | None = None, stats: Callable[[], ReplayStats] | None = None) -> None:  # fmt: skip
        self.source = source
        self.prompt_of = prompt_of
        self.total = total
        self.stats = stats

    @classmethod
    def from_conversations(cls, spec: AgentXTraceWorkload) -> BenchWorkload:
        """AgentX lanes over recorded conversations (spec.length_scale, spec.max_context set to fit)."""
        source = TraceReplaySource(read_conversations(spec.trace, spec.limit), spec)
        return cls(source, lambda req: replay_prompt(source, req), stats=source.stats)

    @classmethod
    def from_trace(cls, path: str, limit: int | None, length_scale: float, request_rate: float | None,
                   seed: int) -> BenchWorkload:  # fmt: skip
        prompts = TracePrompts(read_trace(path, limit=limit), length_scale)
        requests = prompts.requests(request_rate, seed)
        return cls(ListSource(requests), lambda req: prompts.prompt(req.req_id), len(requests))

    @classmethod
    def from_agentx(cls, spec: AgentXWorkload) -> BenchWorkload:
        prompts = SessionPrompts(spec.seed)
        return cls(AgentXSource(spec), prompts.prompt)
