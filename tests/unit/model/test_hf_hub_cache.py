"""The packaged tokenizer laid out as a Hugging Face hub cache resolves by the served model's id,
offline, through huggingface_hub itself (as AIPerf's offline workers resolve it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from huggingface_hub import snapshot_download

from rackserve.model import hf_hub_cache, hf_tokenizer
from rackserve.model.config import ModelConfig


def test_resolves_offline_by_model_id(tmp_path: Path) -> None:
    root = hf_hub_cache.write(tmp_path)
    snapshot = Path(snapshot_download(ModelConfig().model_id, cache_dir=root, local_files_only=True))
    assert {p.name: p.read_text(encoding="utf-8") for p in snapshot.iterdir()} == hf_tokenizer.files()


def test_rewriting_keeps_one_snapshot(tmp_path: Path) -> None:
    hf_hub_cache.write(tmp_path)
    hf_hub_cache.write(tmp_path)
    repo = tmp_path / f"models--{ModelConfig().model_id}"
    revisions = [p.name for p in (repo / "snapshots").iterdir()]
    assert revisions == [(repo / "refs" / "main").read_text()]
    assert len(revisions[0]) == 40 and int(revisions[0], 16) >= 0


def test_cli_prints_the_cache_folder(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "rackserve.cli", "tokenizer-path", "--hf-cache"],
                          capture_output=True, text=True, check=True, timeout=120,
                          env={"XDG_CACHE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    root = Path(done.stdout.strip())
    assert root == tmp_path / "rackserve" / "hf-hub"
    assert snapshot_download(ModelConfig().model_id, cache_dir=root, local_files_only=True)
