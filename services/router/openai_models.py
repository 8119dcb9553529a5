"""OpenAI-shaped request, response, chunk and error bodies of the front door (pydantic).

Requests forbid unknown fields, as OpenAI does ("Unrecognized request argument"); parameters that
OpenAI accepts but the twin does not implement are accepted and validated, then ignored.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1, le=1, description="only n=1 is served")
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    ignore_eos: bool = False  # vLLM's extension: decode to max_tokens even past EOS
    return_token_ids: bool = False  # vLLM's extension: each choice also carries its token ids

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> list[str] | None:
        if value is None:
            return None
        stops = [value] if isinstance(value, str) else value
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop: up to 4 non-empty strings")
        return stops

    def stop_strings(self) -> list[str]:
        return list(self.stop or [])


class CompletionRequest(_Request):
    prompt: str | list[int] = Field(description="text, or token ids")
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=0, description="logprobs are not served")
    best_of: int | None = Field(None, ge=1, le=1)
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, value: str | list[int]) -> str | list[int]:
        if len(value) == 0:
            raise ValueError("prompt must not be empty")
        if isinstance(value, list) and any(t < 0 for t in value):
            raise ValueError("prompt token ids must be non-negative")
        return value


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=0)

    @model_validator(mode="after")
    def _one_max(self) -> ChatCompletionRequest:
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class Timings(BaseModel):
    """rackserve's extension: where the request went and its latencies in simulated seconds."""

    ttft_s: float
    queue_s: float
    prefill_s: float
    kv_transfer_s: float
    first_decode_s: float
    e2e_s: float
    tpot_s: float
    prefill: str
    decode: str
    local_hit_tokens: int
    pool_hit_tokens: int
    pacing_lag_s: float


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def error_body(
    message: str,
    param: str | None = None,
    code: str | None = None,
    kind: str = "invalid_request_error",
) -> dict[str, Any]:
    """OpenAI's error envelope."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
