"""A workload's request mix for the analytic screen: per request its prompt, output, the prompt
tokens its agent's previous turn did not already hold (uncached under in-conversation reuse), and
the idle before it (capped as AgentX caps it), read from the recorded conversations themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rackserve.workload.conversation import TRACE_BLOCK_TOKENS, FanOut, Turn
from rackserve.workload.spec import AgentXTraceWorkload
from rackserve.workload.trace_file import read_conversations


@dataclass(frozen=True)
class Mix:
    prompt: np.ndarray  # tokens per request
    output: np.ndarray
    uncached: np.ndarray  # prompt tokens not shared with the agent's previous turn
    think_s: np.ndarray  # idle before the request, capped
    parallelism: float  # requests in flight per busy lane (subagent fan-outs run side by side)
    overflow_share: float  # requests whose prompt + output exceed the model context (AgentX: invalid > 1%)

    @property
    def cached(self) -> np.ndarray:
        return self.prompt - self.uncached

    def summary(self) -> dict:
        return {"requests": int(self.prompt.size), "prompt_mean": float(self.prompt.mean()),
                "output_mean": float(self.output.mean()), "uncached_mean": float(self.uncached.mean()),
                "cached_share": float(self.cached.sum() / self.prompt.sum()),
                "think_mean_s": float(self.think_s.mean()), "parallelism": self.parallelism,
                "overflow_share": self.overflow_share}


def _slots(step: Turn | FanOut) -> int:
    """Sequential request slots a step takes in its lane: one turn, or the longest gating subagent."""
    if isinstance(step, Turn):
        return 1
    return max(len(s.turns) for s in step.subagents)


def mix_of(workload: AgentXTraceWorkload, cache_block_tokens: int = TRACE_BLOCK_TOKENS) -> Mix:
    """The request mix of an AgentX trace workload (every parent and subagent turn), at its
    length_scale, leaving out requests that overflow its max_context. A prompt's share with its
    agent's previous turn counts as cached in whole blocks of `cache_block_tokens` (the simulator's
    cache granularity: target block x sim.kv_block_multiple), as the replay finds it."""
    if cache_block_tokens <= 0:
        raise ValueError(f"cache_block_tokens: must be positive, got {cache_block_tokens}")
    convs = read_conversations(workload.trace, workload.limit)
    scale = workload.length_scale
    rows, slots, total = [], 0, 0
    for conv in convs:
        slots += sum(_slots(s) for s in conv.steps)
        for turn in conv.all_turns():
            total += 1
            prompt = max(1, round(turn.prompt_tokens * scale))
            out = max(1, round(turn.output_tokens * scale))
            if prompt + out > workload.max_context:
                continue
            shared = min(prompt - 1, round(turn.shared_ids * TRACE_BLOCK_TOKENS * scale))
            shared -= shared % cache_block_tokens
            rows.append((prompt, out, prompt - shared, min(turn.idle_before_s, workload.think_time_cap_s)))
    if not rows:
        raise ValueError(f"workload.trace: {workload.trace} has no request that fits the context")
    arr = np.asarray(rows, dtype=np.float64)
    return Mix(arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], parallelism=total / max(slots, 1),
               overflow_share=1.0 - len(rows) / total)
