"""Byte tokenizer and chat template."""

from __future__ import annotations

import pytest

from rackserve.model import tokenizer as tok


def test_text_roundtrips_including_multibyte():
    text = "héllo, 世界 🚀"
    assert tok.decode(tok.encode(text, bos=True)) == text
    assert max(tok.encode(text)) < 256


def test_chat_template_layout_and_next_turn_extends_prefix():
    turn1 = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    ids1 = tok.apply_chat_template(turn1)
    assert ids1[0] == tok.BOS and ids1[-1] == tok.ASSISTANT
    assert (
        tok.decode(ids1, show_special=True)
        == "<|bos|><|system|>be brief<|end|><|user|>hi<|end|><|assistant|>"
    )
    turn2 = [*turn1, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    assert tok.apply_chat_template(turn2)[: len(ids1)] == ids1


@pytest.mark.parametrize(
    "messages, field",
    [
        ([], "messages"),
        ([{"role": "robot", "content": "x"}], "role"),
        ([{"role": "user", "content": 3}], "content"),
    ],
)
def test_bad_messages_name_the_field(messages, field):
    with pytest.raises(ValueError, match=field):
        tok.apply_chat_template(messages)
