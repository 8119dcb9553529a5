"""The packaged tokenizer as a Hugging Face hub cache, for clients that look tokenizers up by id.

AIPerf 0.13 builds Mooncake-trace prompts of 10+ records in worker processes that force
HF_HUB_OFFLINE=1, and offline it resolves `--tokenizer` only as a hub id in the hub cache
(`snapshot_download(name, local_files_only=True)`), never as a folder. Laid out as that cache
(huggingface_hub's documented layout: `models--ID/refs/main` holding a revision, the files under
`models--ID/snapshots/REVISION/`), the tokenizer resolves by the served model's id with no
download: `HF_HUB_CACHE=$(rackserve tokenizer-path --hf-cache) HF_HUB_OFFLINE=1`, then
`--tokenizer rackserve-moe-small` (or no --tokenizer: clients default to the model id).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from rackserve.model import hf_tokenizer
from rackserve.model.config import ModelConfig


def default_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rackserve" / "hf-hub"


def revision(files: dict[str, str]) -> str:
    """A 40-hex revision named after the files' contents (a new tokenizer is a new snapshot)."""
    digest = hashlib.sha1(usedforsecurity=False)
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    return digest.hexdigest()


def write(root: Path | None = None, model_id: str = ModelConfig().model_id) -> Path:
    """Lay the tokenizer out under `root` as the hub cache entry of `model_id`; return `root`
    (the value for HF_HUB_CACHE). Idempotent: an existing snapshot of these files is kept."""
    root = root or default_root()
    files = hf_tokenizer.files()
    rev = revision(files)
    repo = root / f"models--{model_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / rev
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        target = snapshot / name
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(rev)
    return root
