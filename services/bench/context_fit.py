"""Fit the benchmark's load to the served model's context (`max_model_len` of /v1/models).

A recorded trace is scaled down by one length scale (prompts, outputs and blocks alike). Left out,
the scale is the largest at which at most 1 % of the trace's requests overflow (AgentX's validity
bound); given, it is refused up front when more would overflow. AgentX-like synthetic sessions are
refused when their very first prompt cannot fit. Every refusal is one ContextFitError message that
says what to pass instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rackserve.workload.conversation import Conversation
from rackserve.workload.spec import AgentXWorkload
from rackserve.workload.trace_replay import MAX_OVERFLOW_SHARE

FIT_QUANTILE = 1.0 - MAX_OVERFLOW_SHARE
SCALE_STEP = 0.99  # shrink by 1 % until rounding agrees with the quantile estimate


class ContextFitError(ValueError):
    """The load cannot run on this model's context as asked."""


def trace_lengths(conversations: Sequence[Conversation]) -> tuple[np.ndarray, np.ndarray]:
    """(prompt tokens, output tokens) of every request of the conversations."""
    turns = [t for c in conversations for t in c.all_turns()]
    return (np.array([t.prompt_tokens for t in turns], dtype=np.int64),
            np.array([t.output_tokens for t in turns], dtype=np.int64))  # fmt: skip


def overflow_share(prompts: np.ndarray, outputs: np.ndarray, scale: float, context: int) -> float:
    """Share of requests whose scaled prompt + output exceeds `context` (the replay's rounding)."""
    p = np.maximum(1, np.round(prompts * scale))
    o = np.maximum(1, np.round(outputs * scale))
    return float(np.mean(p + o > context)) if p.size else 0.0


def fit_length_scale(prompts: np.ndarray, outputs: np.ndarray, context: int,
                     requested: float | None = None) -> float:  # fmt: skip
    """The length scale to replay at; ContextFitError when `requested` overflows too often."""
    best = min(1.0, context / float(np.quantile(prompts + outputs, FIT_QUANTILE)))
    while best > 1e-6 and overflow_share(prompts, outputs, best, context) > MAX_OVERFLOW_SHARE:
        best *= SCALE_STEP
    if requested is None:
        return best
    share = overflow_share(prompts, outputs, requested, context)
    if share > MAX_OVERFLOW_SHARE:
        raise ContextFitError(
            f"--length-scale {requested:g}: {share:.1%} of the trace's requests (prompt + output) exceed "
            f"the model's {context:,}-token context (max_model_len of /v1/models; AgentX allows "
            f"{MAX_OVERFLOW_SHARE:.0%}); use --length-scale {best:.4g} or less, or leave it out to fit"
        )
    return requested


def check_agentx_fits(spec: AgentXWorkload, context: int) -> None:
    """ContextFitError when the sessions' first prompt + output cannot fit the model's context."""
    first = spec.system_prompt_tokens + spec.tool_defs_tokens + spec.first_user_tokens
    if first + spec.output_tokens > context:
        raise ContextFitError(
            f"--agentx: every session's first prompt is {first:,} tokens (system {spec.system_prompt_tokens:,}"
            f" + tool definitions {spec.tool_defs_tokens:,} + user {spec.first_user_tokens:,}) plus "
            f"{spec.output_tokens:,} output, over the model's {context:,}-token context (max_model_len of "
            "/v1/models): lower --agentx-system-tokens / --agentx-tool-defs-tokens / "
            "--agentx-first-user-tokens, or replay the recorded traces with --trace FILE (they scale to fit)"
        )
