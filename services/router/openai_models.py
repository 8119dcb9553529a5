"""OpenAI-shaped request, response, chunk and error bodies of the front door (pydantic).

The request surface is vLLM's OpenAI server's (vllm/entrypoints/openai/completion/protocol.py and
chat_completion/protocol.py): every field vLLM accepts is accepted here. Fields that do not change
this model's output (request_id, priority, skip_special_tokens, ...) are accepted and ignored;
fields whose non-default value this server cannot honour (top_k, beam search, tools, ...) are
accepted at their default and otherwise get a 400 naming the field. A field vLLM does not know
either gets OpenAI's "Unrecognized request argument supplied" (vLLM ignores such fields, which
hides typos). Types are strict, as the OpenAI API defines them (`max_tokens: true` is not 1, a
number is not a string) and numbers finite; messages name the field, never a validator's name.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from rackserve.model.logprobs import MAX_TOP_LOGPROBS
from rackserve.model.tokenizer import VOCAB_SIZE

# Strict JSON types (no bool for an int, no "1" for a number) and no NaN or infinity.
STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for a logit_bias value: [-100, 100]


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False  # vLLM's: usage (so far) in every chunk

    @property
    def usage_last(self) -> bool:
        return bool(self.include_usage)

    @property
    def usage_every_chunk(self) -> bool:
        """vLLM sends per-chunk usage only when include_usage is set too."""
        return bool(self.include_usage and self.continuous_usage_stats)


# vLLM sampling / extra fields that change output: accepted only at these neutral values.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "use_beam_search": (False,),
    "top_k": (None, 0, -1),
    "min_p": (None, 0, 0.0),
    "length_penalty": (1, 1.0),
    "stop_token_ids": (None, []),
    "include_stop_str_in_output": (False,),
    "truncate_prompt_tokens": (None,),
    "allowed_token_ids": (None,),
    "prompt_logprobs": (None,),
    "logprob_token_ids": (None,),
    "bad_words": (None, []),
    "prompt_embeds": (None,),
    "structured_outputs": (None,),
    "repetition_detection": (None,),
    "thinking_token_budget": (None, -1),
    "ec_transfer_params": (None,),
    "watermarking": (None, False),
    "logits_processors": (None,),
}


MAX_N = 16  # choices per request; each is a full request to the cluster


class _Request(BaseModel):
    model_config = STRICT

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1, le=MAX_N, description="choices, each its own trip (seed + index)")
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    ignore_eos: bool = False  # vLLM's extension: decode to max_tokens even past EOS
    return_token_ids: bool | None = False  # vLLM's extension: each choice also carries its ids
    min_tokens: int = Field(0, ge=0)  # vLLM's: EOS is banned until this many tokens
    repetition_penalty: float | None = Field(None, gt=0)  # vLLM's (1 = off)
    # vLLM's fields that do not change this model's output: accepted, ignored.
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    add_special_tokens: bool | None = None
    priority: int = 0
    request_id: str | None = None
    session_id: str | None = None
    cache_salt: str | None = Field(None, min_length=1, max_length=1024)
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None
    stream_interval: int | None = Field(None, ge=1)
    return_tokens_as_token_ids: bool | None = None
    truncation_side: Literal["left", "right"] | None = None
    response_format: dict[str, Any] | None = None
    # vLLM's fields that change output: accepted at their neutral value only (NEUTRAL).
    use_beam_search: bool = False
    top_k: int | None = None
    min_p: float | None = None
    length_penalty: float = 1.0
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    truncate_prompt_tokens: int | None = None
    allowed_token_ids: list[int] | None = None
    prompt_logprobs: int | None = None
    prompt_embeds: Any = None
    logprob_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    structured_outputs: dict[str, Any] | None = None
    repetition_detection: dict[str, Any] | None = None
    thinking_token_budget: int | None = None
    ec_transfer_params: dict[str, Any] | None = None
    watermarking: bool | None = None
    logits_processors: list[Any] | None = None

    @field_validator(*NEUTRAL, mode="after")
    @classmethod
    def _neutral_only(cls, value: Any, info: ValidationInfo) -> Any:
        if value not in NEUTRAL[info.field_name]:
            raise ValueError(
                f"not supported by this server (only {NEUTRAL[info.field_name][0]!r} is served)"
            )
        return value

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value.get("type", "text") != "text":
            raise ValueError("only {'type': 'text'} is served (no structured output)")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (value or {}).items():
            if not key.isdigit() or int(key) >= VOCAB_SIZE:
                raise ValueError(f"{key!r} is not a token id (0 to {VOCAB_SIZE - 1})")
            if abs(bias) > MAX_LOGIT_BIAS:
                raise ValueError(f"the bias of token {key} must be in [-100, 100], got {bias}")
        return value

    def logit_bias_pairs(self) -> tuple[tuple[int, float], ...]:
        return tuple(sorted((int(k), float(v)) for k, v in (self.logit_bias or {}).items()))

    @model_validator(mode="after")
    def _min_tokens(self) -> _Request:
        if self.min_tokens and self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens: {self.min_tokens} must not exceed max_tokens ({self.max_tokens})"
            )
        return self

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _Request:
        if self.stream_options is not None and not self.stream:
            raise ValueError("Stream options can only be defined when `stream=True`.")
        return self

    def top_logprobs_asked(self) -> int | None:
        """Alternatives per token's logprob the request asks for; None: no logprobs."""
        return None

    def prompt_logprobs_asked(self) -> int | None:
        """Alternatives of the prompt tokens' logprobs; None: not asked."""
        return None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> list[str] | None:
        if value is None:
            return None
        stops = [value] if isinstance(value, str) else value
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("up to 4 non-empty strings")
        return stops

    def stop_strings(self) -> list[str]:
        return list(self.stop or [])


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str] | list[list[int]] = Field(description="text, or token ids")
    echo: bool | None = False
    logprobs: int | None = Field(
        None, ge=0, le=MAX_TOP_LOGPROBS, description="the sampled token's and this many more"
    )
    best_of: int | None = Field(None, ge=1)  # = n only: no ranking of extra candidates
    suffix: str | None = None  # no fill-in-the-middle: a suffix is refused
    max_completion_tokens: int | None = Field(None, ge=1)  # sent by some clients; = max_tokens

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: Any) -> str | list[int]:
        if isinstance(value, list) and value and not isinstance(value[0], int):
            if len(value) != 1:  # vLLM's batch form: one choice per prompt, n=1 here
                raise ValueError(f"one prompt per request is served, got {len(value)}")
            value = value[0]
        if len(value) == 0:
            raise ValueError("must not be empty")
        if isinstance(value, list) and any(t < 0 for t in value):
            raise ValueError("token ids must be non-negative")
        return value

    def top_logprobs_asked(self) -> int | None:
        return self.logprobs

    def prompt_logprobs_asked(self) -> int | None:
        """Alternatives of the prompt tokens' logprobs (echo with logprobs, as vLLM reads it)."""
        return self.logprobs if self.echo else None

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("not supported by this server (the model has no fill-in-the-middle)")
        return value

    @model_validator(mode="after")
    def _best_of_is_n(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError(
                f"best_of: only best_of = n ({self.n}) is served (no ranking of extra candidates), "
                f"got {self.best_of}"
            )
        return self

    @model_validator(mode="after")
    def _one_max(self) -> CompletionRequest:
        if self.max_tokens is None and self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self


class TextPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    # vLLM's message fields: a reply's reasoning is not part of the prompt (ignored); tool calls
    # would be, and this model has no tools (accepted only empty)
    reasoning: str | None = None
    reasoning_content: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[Any] | None = None

    @field_validator("tool_calls")
    @classmethod
    def _no_tool_calls(cls, value: list[Any] | None) -> list[Any] | None:
        if value:
            raise ValueError("not supported by this server (a text model without tools)")
        return value

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None  # the template takes none: ignored
    parallel_tool_calls: bool | None = None
    include_reasoning: bool = True
    reasoning_effort: str | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    echo: bool = False
    continue_final_message: bool = False
    chat_template: str | None = None
    documents: list[Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None

    @field_validator("tools", "documents", "chat_template", "mm_processor_kwargs")
    @classmethod
    def _none_only(cls, value: Any, info: ValidationInfo) -> Any:
        if value:
            raise ValueError("not supported by this server (a text model without tools)")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _no_tool_choice(cls, value: Any) -> Any:
        if value not in (None, "none", "auto"):
            raise ValueError("not supported by this server (no tools)")
        return value

    @field_validator("echo", "continue_final_message")
    @classmethod
    def _false_only(cls, value: bool) -> bool:
        if value:
            raise ValueError("not supported by this server")
        return value

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("when using `top_logprobs`, `logprobs` must be set to true.")
        return self

    def top_logprobs_asked(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @model_validator(mode="after")
    def _one_max_chat(self) -> ChatCompletionRequest:
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize body: a `prompt` (completion form) or `messages` (chat form)."""

    model_config = STRICT
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool | None = None
    return_token_strs: bool | None = False
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self


class DetokenizeRequest(BaseModel):
    model_config = STRICT
    model: str | None = None
    tokens: list[int] = Field(min_length=0)


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
