"""Older trees for side-by-side runs: a commit's short name, and its files in a temporary directory
(`git archive`), for a bench to run with PYTHONPATH pointing there."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commit(ref: str = "HEAD") -> str:
    """The short hash of `ref` in this repository."""
    out = subprocess.run(["git", "rev-parse", "--short", ref], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def archived(ref: str, prefix: str) -> tempfile.TemporaryDirectory:
    """`ref`'s tree extracted into a new temporary directory (removed by its cleanup / context exit)."""
    tmp = tempfile.TemporaryDirectory(prefix=prefix)
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", tmp.name], input=archive.stdout, check=True)
    return tmp
