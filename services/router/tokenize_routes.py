"""vLLM's /tokenize and /detokenize on the front door: the server's own ids for a prompt or a chat.

Same bodies as vLLM's (vllm/entrypoints/serve/tokenize): /tokenize takes `prompt` or `messages`
and answers {count, max_model_len, tokens, token_strs}; /detokenize takes `tokens` and answers
{prompt}. Token strings are the Hugging Face tokenizer's (`rackserve tokenizer-path`).
"""

from __future__ import annotations

from typing import Protocol

from fastapi import FastAPI

from rackserve.model import hf_tokenizer, tokenizer
from services.router.openai_models import DetokenizeRequest, TokenizeRequest
from services.router.prompt_ids import BadRequest, chat_prompt, check_model, completion_prompt

_ALPHABET = hf_tokenizer.byte_alphabet()
_SPECIAL_NAMES = {i: name for name, i in tokenizer.SPECIAL_TOKENS.items()}


def token_str(token_id: int) -> str:
    """The Hugging Face tokenizer's string for one id (GPT-2 byte alphabet, special names)."""
    return _ALPHABET[token_id] if token_id < 256 else _SPECIAL_NAMES[token_id]


class ServedModel(Protocol):
    """What the routes read from the front door (services.router.app.FrontDoor)."""

    @property
    def model_id(self) -> str: ...

    @property
    def max_context(self) -> int: ...


def add_tokenize_routes(app: FastAPI, door: ServedModel) -> None:
    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict:
        check_model(door.model_id, body.model)
        if body.continue_final_message:
            raise BadRequest("continue_final_message: not supported by this server",
                             "continue_final_message")
        if body.messages is not None:
            ids = chat_prompt(body.messages, body.add_generation_prompt)
        else:
            ids = completion_prompt(body.prompt or "")
        reply = {"count": len(ids), "max_model_len": door.max_context, "tokens": ids}
        if body.return_token_strs:
            reply["token_strs"] = [token_str(i) for i in ids]
        return reply

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict:
        check_model(door.model_id, body.model)
        bad = [t for t in body.tokens if not 0 <= t < tokenizer.VOCAB_SIZE]
        if bad:
            raise BadRequest(
                f"tokens: ids must be in [0, {tokenizer.VOCAB_SIZE}), got {bad[0]}", "tokens"
            )
        return {"prompt": tokenizer.decode(body.tokens, show_special=True)}

