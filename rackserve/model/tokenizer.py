"""Byte-level tokenizer with special tokens, and the chat template the OpenAI front door uses.

Ids 0-255 are the UTF-8 bytes; special tokens follow. Any text round-trips exactly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

PAD = 256
BOS = 257
EOS = 258
SYSTEM = 259
USER = 260
ASSISTANT = 261
END = 262  # closes one chat message
RESERVED = 263  # never produced; pads the vocabulary to a multiple of 8
VOCAB_SIZE = 264

SPECIAL_TOKENS: dict[str, int] = {
    "<|pad|>": PAD,
    "<|bos|>": BOS,
    "<|eos|>": EOS,
    "<|system|>": SYSTEM,
    "<|user|>": USER,
    "<|assistant|>": ASSISTANT,
    "<|end|>": END,
    "<|reserved|>": RESERVED,
}
ROLE_TOKENS: dict[str, int] = {"system": SYSTEM, "user": USER, "assistant": ASSISTANT}
_SPECIAL_NAMES = {v: k for k, v in SPECIAL_TOKENS.items()}
_SPECIAL_TEXT = re.compile("|".join(re.escape(name) for name in SPECIAL_TOKENS))


class UnencodableText(ValueError):
    """Text with a character UTF-8 cannot encode (a lone surrogate such as an escaped "\\ud800")."""

    def __init__(self, text: str, where: str = "text") -> None:
        index = next(i for i, ch in enumerate(text) if 0xD800 <= ord(ch) <= 0xDFFF)
        self.where, self.index, self.char = where, index, text[index]
        super().__init__(
            f"{where}: character {index} is a lone surrogate U+{ord(self.char):04X}, "
            "which is not valid Unicode text and cannot be tokenized"
        )


def utf8(text: str, where: str = "text") -> bytes:
    """`text` as UTF-8; UnencodableText (a ValueError naming `where` and the character) if it
    holds a lone surrogate, the only str content UTF-8 cannot encode."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise UnencodableText(text, where) from None


def encode(text: str, *, bos: bool = False, where: str = "text", special: bool = False) -> list[int]:
    """UTF-8 bytes of `text` as ids, optionally after BOS. With `special`, a special token's name
    in the text ("<|eos|>") is that token, as a Hugging Face tokenizer (and so vLLM) reads text."""
    ids = list(utf8(text, where))
    if special and "<|" in text:
        ids, start = [], 0
        for match in _SPECIAL_TEXT.finditer(text):
            ids += text[start : match.start()].encode("utf-8")
            ids.append(SPECIAL_TOKENS[match.group()])
            start = match.end()
        ids += text[start:].encode("utf-8")
    return [BOS, *ids] if bos else ids


def decode_bytes(ids: Iterable[int]) -> bytes:
    """The raw bytes of the byte tokens (special tokens dropped); join before decoding UTF-8."""
    return bytes(i for i in ids if 0 <= i < 256)


def decode(ids: Iterable[int], *, show_special: bool = False) -> str:
    """Text of `ids`; invalid UTF-8 (e.g. a cut multi-byte char) becomes U+FFFD."""
    if not show_special:
        return decode_bytes(ids).decode("utf-8", errors="replace")
    parts: list[str] = []
    run: list[int] = []
    for i in ids:
        if i < 256:
            run.append(i)
            continue
        parts.append(bytes(run).decode("utf-8", errors="replace"))
        run = []
        parts.append(_SPECIAL_NAMES.get(i, f"<|{i}|>"))
    parts.append(bytes(run).decode("utf-8", errors="replace"))
    return "".join(parts)


def apply_chat_template(
    messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True,
    special: bool = False,
) -> list[int]:
    """`[{"role": ..., "content": ...}, ...]` -> ids: BOS, then `<|role|> content <|end|>` per
    message, then `<|assistant|>` when a reply is to be generated.

    A conversation's next turn extends the previous turn's ids, so its KV blocks are a cached prefix.
    `special`: special-token names inside a content are those tokens (see `encode`).
    """
    if not messages:
        raise ValueError("messages must not be empty")
    ids = [BOS]
    for n, message in enumerate(messages):
        role = message.get("role")
        if role not in ROLE_TOKENS:
            raise ValueError(
                f"messages[{n}].role must be one of {sorted(ROLE_TOKENS)}, got {role!r}"
            )
        content = message.get("content")
        if not isinstance(content, str):
            raise ValueError(f"messages[{n}].content must be a string")
        body = encode(content, where=f"messages.{n}.content", special=special)
        ids += [ROLE_TOKENS[role], *body, END]
    if add_generation_prompt:
        ids.append(ASSISTANT)
    return ids
