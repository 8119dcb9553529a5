"""The byte tokenizer of `tokenizer.py` in Hugging Face format, for outside load clients.

AIPerf, guidellm and `vllm bench serve` build prompts and count tokens with a Hugging Face
tokenizer; the folder `tokenizer_files/` (shipped in the package, `rackserve tokenizer-path`)
holds one that gives exactly the server's ids: a BPE model with no merges over the 256 bytes (in
GPT-2's byte-to-unicode alphabet, the `ByteLevel` pre-tokenizer without its regex split), the
special and chat-role tokens as added tokens, and the chat template as Jinja. The files are
generated from this module (`python -m rackserve.model.hf_tokenizer`); a unit test checks that
the committed files equal what it generates and that `tokenizers` encodes like `tokenizer.encode`.

One difference is inherent to every Hugging Face tokenizer: a literal "<|user|>" inside a prompt
becomes the special token there, and its 8 bytes here (the server never lets text forge a role).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rackserve.model import tokenizer
from rackserve.model.config import ModelConfig

FILES_DIR = Path(__file__).resolve().parent / "tokenizer_files"
ROLE_NAMES = ("system", "user", "assistant")

# `apply_chat_template` in Jinja: BOS, then <|role|> content <|end|> per message, then
# <|assistant|> when a reply is to be generated. "developer" is served as "system"; a list of
# text parts is joined, as the front door joins them.
CHAT_TEMPLATE = (
    "{{- '<|bos|>' -}}"
    "{%- for message in messages -%}"
    "{%- set role = 'system' if message['role'] == 'developer' else message['role'] -%}"
    "{%- if role not in ['system', 'user', 'assistant'] -%}"
    "{{- raise_exception('messages: role must be one of system, developer, user, assistant') -}}"
    "{%- endif -%}"
    "{{- '<|' + role + '|>' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- elif message['content'] -%}"
    "{%- for part in message['content'] -%}{{- part['text'] -}}{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|end|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>' -}}{%- endif -%}"
)


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each byte value (the ByteLevel pre-tokenizer's alphabet):
    printable Latin-1 bytes stand for themselves, the others for 256, 257, ... in order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _added(content: str, token_id: int) -> dict:
    return {
        "id": token_id,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }


def _byte_level() -> dict:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}


def tokenizer_json() -> dict:
    """tokenizer.json: ids 0-255 are the bytes, special tokens follow (no BOS added on encode)."""
    vocab = {char: b for b, char in enumerate(byte_alphabet())}
    specials = sorted(tokenizer.SPECIAL_TOKENS.items(), key=lambda kv: kv[1])
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_added(name, i) for name, i in specials],
        "normalizer": None,
        "pre_tokenizer": _byte_level(),
        "post_processor": None,
        "decoder": _byte_level(),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }


def tokenizer_config_json() -> dict:
    """tokenizer_config.json: what transformers' AutoTokenizer needs, with the chat template."""
    names = {i: name for name, i in tokenizer.SPECIAL_TOKENS.items()}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": ModelConfig().max_context,
        "bos_token": names[tokenizer.BOS],
        "eos_token": names[tokenizer.EOS],
        "pad_token": names[tokenizer.PAD],
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "additional_special_tokens": [f"<|{r}|>" for r in ROLE_NAMES] + [names[tokenizer.END]],
        "added_tokens_decoder": {
            str(i): {k: v for k, v in _added(name, i).items() if k != "id"}
            for i, name in sorted(names.items())
        },
        "chat_template": CHAT_TEMPLATE,
    }


def special_tokens_map_json() -> dict:
    config = tokenizer_config_json()
    keys = ("bos_token", "eos_token", "pad_token", "additional_special_tokens")
    return {k: config[k] for k in keys}


def generation_config_json() -> dict:
    """generation_config.json: the ids that end a reply (clients read EOS from here)."""
    return {"bos_token_id": tokenizer.BOS, "eos_token_id": tokenizer.EOS, "pad_token_id": tokenizer.PAD}


def files() -> dict[str, str]:
    """File name -> exact text of every file in FILES_DIR."""
    docs = {
        "tokenizer.json": tokenizer_json(),
        "tokenizer_config.json": tokenizer_config_json(),
        "special_tokens_map.json": special_tokens_map_json(),
        "generation_config.json": generation_config_json(),
    }
    return {name: json.dumps(doc, indent=2, ensure_ascii=False) + "\n" for name, doc in docs.items()}


def path() -> Path:
    """The packaged tokenizer folder (pass it as `--tokenizer` to a load client)."""
    return FILES_DIR


def write(folder: Path = FILES_DIR) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name, text in files().items():
        (folder / name).write_text(text, encoding="utf-8")
        out.append(folder / name)
    return out


if __name__ == "__main__":
    for written in write(Path(sys.argv[1]) if len(sys.argv) > 1 else FILES_DIR):
        print(written)
