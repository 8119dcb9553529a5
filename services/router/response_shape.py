"""How a finished (or streaming) request is dressed as an OpenAI object: choices, deltas, usage,
and rackserve's `rackserve` timings extension (simulated seconds)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.router.openai_models import PromptTokensDetails, Timings, Usage
from services.router.orchestrator import Trip


@dataclass(frozen=True)
class Shape:
    """How to dress text as an OpenAI object (completion vs chat, echo)."""

    obj: str
    model: str
    chat: bool
    echo: str = ""

    def choice(self, text: str, finish: str | None) -> dict:
        if self.chat:
            return {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
                "logprobs": None,
            }
        return {"index": 0, "text": self.echo + text, "finish_reason": finish, "logprobs": None}

    def delta(self, text: str, finish: str | None, first: bool) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            return {
                "index": 0,
                "delta": delta if text or first else {},
                "finish_reason": finish,
                "logprobs": None,
            }
        return {
            "index": 0,
            "text": (self.echo if first else "") + text,
            "finish_reason": finish,
            "logprobs": None,
        }


def usage_of(trips: Sequence[Trip], details: bool = True) -> dict:
    """The usage of a request's choices: the prompt once (as vLLM counts it), every output."""
    prompt, completion = trips[0].prompt_tokens, sum(t.completion_tokens for t in trips)
    usage = Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=trips[0].cached_tokens),
    ).model_dump()
    if not details:  # vLLM's per-chunk usage carries the three counts only
        del usage["prompt_tokens_details"]
    return usage


def timings_of(trip: Trip) -> dict:
    return Timings(
        ttft_s=trip.ttft_s,
        queue_s=trip.queue_s,
        prefill_s=trip.prefill_s,
        kv_transfer_s=trip.kv_transfer_s,
        first_decode_s=trip.first_decode_s,
        e2e_s=trip.e2e_s,
        tpot_s=trip.tpot_s,
        prefill=trip.prefill,
        decode=trip.decode,
        local_hit_tokens=trip.local_hit_tokens,
        pool_hit_tokens=trip.pool_hit_tokens,
        pacing_lag_s=trip.pacing_lag_s,
    ).model_dump()
