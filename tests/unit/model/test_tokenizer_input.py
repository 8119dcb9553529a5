"""Text the byte tokenizer cannot encode (a lone surrogate) is a ValueError that names where."""

from __future__ import annotations

import pytest

from rackserve.model import tokenizer


def test_lone_surrogate_names_position() -> None:
    with pytest.raises(tokenizer.UnencodableText) as info:
        tokenizer.encode("a\ud800b", where="prompt")
    assert info.value.index == 1 and info.value.where == "prompt"
    assert str(info.value).startswith("prompt: character 1 is a lone surrogate U+D800")
    assert "codec" not in str(info.value)


def test_chat_surrogate_names_the_message() -> None:
    with pytest.raises(tokenizer.UnencodableText) as info:
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "ok"}, {"role": "user", "content": "x\udfff"}]
        )
    assert info.value.where == "messages.1.content"


def test_valid_text_round_trips() -> None:
    text = "héllo \U0001f600 \x00"
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_special_names_are_tokens_only_when_asked() -> None:
    text = "a<|eos|>b<|end"
    assert tokenizer.encode(text, special=True) == [97, tokenizer.EOS, 98, *b"<|end"]
    assert tokenizer.encode(text) == list(text.encode())
