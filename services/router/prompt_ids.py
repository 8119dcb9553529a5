"""Request text -> the server's token ids, with the 4xx errors of the front door's edge.

Completions and /tokenize share `completion_prompt`, chat and /tokenize share `chat_prompt`, so
a client's count from /tokenize is always the prompt_tokens that generation reports. Text is read
as vLLM reads it through its Hugging Face tokenizer: a special token's name ("<|eos|>") in a prompt
or a message is that token (load clients such as AIPerf put one between synthesized blocks), so a
client counting with `rackserve tokenizer-path` gets the server's count.
"""

from __future__ import annotations

from rackserve.model import tokenizer
from services.router.openai_models import ChatMessage


class BadRequest(Exception):
    def __init__(
        self, message: str, param: str | None = None, code: str | None = None, status: int = 400
    ):
        super().__init__(message)
        self.param, self.code, self.status = param, code, status


def check_model(served: str, model: str | None) -> None:
    if model is not None and model != served:
        raise BadRequest(f"The model `{model}` does not exist.", "model", "model_not_found", 404)


def completion_prompt(prompt: str | list[int]) -> list[int]:
    """A completion prompt's ids (no BOS is added: the tokenizer adds none)."""
    if not isinstance(prompt, str):
        return prompt
    try:
        return tokenizer.encode(prompt, where="prompt", special=True)
    except tokenizer.UnencodableText as exc:
        raise BadRequest(str(exc), "prompt") from None


def chat_prompt(messages: list[ChatMessage], add_generation_prompt: bool = True) -> list[int]:
    """The chat template's ids (400 naming the message whose text cannot be tokenized)."""
    plain = [
        {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        for m in messages
    ]
    try:
        return tokenizer.apply_chat_template(
            plain, add_generation_prompt=add_generation_prompt, special=True
        )
    except tokenizer.UnencodableText as exc:
        raise BadRequest(str(exc), exc.where) from None
    except ValueError as exc:
        raise BadRequest(str(exc), "messages") from None
