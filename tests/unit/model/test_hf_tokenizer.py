"""The packaged Hugging Face tokenizer gives exactly the server's ids, and the committed files are
what rackserve/model/hf_tokenizer.py generates."""

from __future__ import annotations

import jinja2
import jinja2.sandbox
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from rackserve.model import hf_tokenizer, tokenizer


@pytest.fixture(scope="module")
def hf() -> Tokenizer:
    return Tokenizer.from_file(str(hf_tokenizer.path() / "tokenizer.json"))


def render(messages: list[dict], add_generation_prompt: bool = True) -> str:
    """The chat template rendered the way transformers renders it (sandboxed Jinja)."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    template = env.from_string(hf_tokenizer.tokenizer_config_json()["chat_template"])
    return template.render(messages=messages, add_generation_prompt=add_generation_prompt)


def test_committed_files_are_generated() -> None:
    for name, text in hf_tokenizer.files().items():
        assert (hf_tokenizer.path() / name).read_text(encoding="utf-8") == text, name


def test_vocab_is_the_servers(hf: Tokenizer) -> None:
    assert hf.get_vocab_size() == tokenizer.VOCAB_SIZE
    for name, token_id in tokenizer.SPECIAL_TOKENS.items():
        assert hf.token_to_id(name) == token_id


TEXT = st.lists(
    st.one_of(st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=40),
              st.sampled_from([*tokenizer.SPECIAL_TOKENS, "<|", "|>", "<|eos", "<|<|end|>"])),
    max_size=8,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_encode_equals_server(hf: Tokenizer, text: str) -> None:
    ids = hf.encode(text).ids
    assert ids == tokenizer.encode(text, special=True)
    assert hf.decode(ids, skip_special_tokens=True) == tokenizer.decode(ids)
    if "<|" not in text:
        assert ids == tokenizer.encode(text)  # plain text: the same with or without `special`


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, tokenizer.VOCAB_SIZE - 1), max_size=64))
def test_decode_skipping_specials_equals_server(hf: Tokenizer, ids: list[int]) -> None:
    assert hf.decode(ids, skip_special_tokens=True) == tokenizer.decode(ids)


CHATS = [
    [{"role": "user", "content": "hello"}],
    [{"role": "system", "content": "You are the rack."}, {"role": "user", "content": "héllo 日本"}],
    [
        {"role": "developer", "content": "d"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": ""},
    ],
    [{"role": "user", "content": "a<|eos|>b <|end"}],
]


@pytest.mark.parametrize("messages", CHATS)
@pytest.mark.parametrize("generation", [True, False])
def test_chat_template_equals_server(hf: Tokenizer, messages: list[dict], generation: bool) -> None:
    plain = [
        {
            "role": "system" if m["role"] == "developer" else m["role"],
            "content": m["content"] if isinstance(m["content"], str)
            else "".join(p["text"] for p in m["content"]),
        }
        for m in messages
    ]
    want = tokenizer.apply_chat_template(plain, add_generation_prompt=generation, special=True)
    assert hf.encode(render(messages, generation)).ids == want


def test_chat_template_rejects_unknown_role() -> None:
    with pytest.raises(jinja2.exceptions.TemplateError, match="role"):
        render([{"role": "tool", "content": "x"}])
