"""OpenAI's `logprobs` objects from the sampled tokens' logprobs (rackserve.model.logprobs).

Completions: `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}` (top_logprobs holds the
sampled token and its alternatives, as vLLM's does); chat: `{"content": [{"token", "logprob",
"bytes", "top_logprobs"}]}`. The byte-level tokenizer's lone non-ASCII bytes are spelled
"bytes:\\xNN", as vLLM spells byte-fallback tokens; special tokens by their names.
"""

from __future__ import annotations

from collections.abc import Sequence

from rackserve.model import tokenizer
from rackserve.model.logprobs import TokenLogprob
from services._proto import prefill_pb2

UNKNOWN_LOGPROB = -9999.0  # a token whose logprob the engine did not give (OpenAI's floor value)


def logprob_of(pb: prefill_pb2.TokenLogprob) -> TokenLogprob:
    return TokenLogprob(pb.logprob, tuple(zip(pb.top_ids, pb.top_logprobs, strict=True)))


def token_text(token: int) -> str:
    if token >= 256:
        return tokenizer.decode([token], show_special=True)
    if token < 0x80:
        return chr(token)
    return f"bytes:\\x{token:02x}"


def token_bytes(token: int) -> list[int]:
    return [token] if token < 256 else list(token_text(token).encode())


def _chars(token: int) -> int:
    """Characters `token` adds to the decoded text (a UTF-8 continuation byte adds none)."""
    if token >= 256:
        return 0
    return 0 if 0x80 <= token < 0xC0 else 1


def completion_logprobs(
    ids: Sequence[int], logprobs: Sequence[TokenLogprob | None], offset: int = 0
) -> dict:
    """The completions `logprobs` object of `ids`; text offsets start at `offset` (the echo)."""
    out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token, lp in zip(ids, logprobs, strict=True):
        out["tokens"].append(token_text(token))
        out["token_logprobs"].append(lp.logprob if lp is not None else None)
        top = None  # unknown (the first prompt token has none), as OpenAI and vLLM give it
        if lp is not None:
            top = {token_text(t): v for t, v in lp.top}
            top.setdefault(token_text(token), lp.logprob)
        out["top_logprobs"].append(top)
        out["text_offset"].append(offset)
        offset += _chars(token)
    return out


def chat_logprobs(ids: Sequence[int], logprobs: Sequence[TokenLogprob | None]) -> dict:
    """The chat `logprobs` object of `ids`."""

    def entry(token: int, value: float) -> dict:
        return {"token": token_text(token), "logprob": value, "bytes": token_bytes(token)}

    content = []
    for token, lp in zip(ids, logprobs, strict=True):
        item = entry(token, lp.logprob if lp is not None else UNKNOWN_LOGPROB)
        item["top_logprobs"] = [entry(t, v) for t, v in lp.top] if lp is not None else []
        content.append(item)
    return {"content": content}
