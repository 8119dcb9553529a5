"""Older trees for side-by-side runs: a commit's short name, and its files in a temporary directory
(`git archive`), for a bench to run with PYTHONPATH pointing there. A tree with compiled parts
(setup.py's optional extensions) gets them built in place, as `make venv` builds ours: without them
its Python twins would run, and the comparison would be against a slower tree than the commit is."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def commit(ref: str = "HEAD") -> str:
    """The short hash of `ref` in this repository."""
    out = subprocess.run(["git", "rev-parse", "--short", ref], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def archived(ref: str, prefix: str) -> tempfile.TemporaryDirectory:
    """`ref`'s tree extracted into a new temporary directory (removed by its cleanup / context exit)."""
    tmp = tempfile.TemporaryDirectory(prefix=prefix)
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", tmp.name], input=archive.stdout, check=True)
    built(Path(tmp.name))
    return tmp


def built(tree: Path) -> Path:
    """Build `tree`'s C extensions in place when it has any (setup.py), with this interpreter's
    setuptools; optional extensions that do not build leave their Python twins to run."""
    if (tree / "setup.py").exists():
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree, check=True,
                       capture_output=True)
    return tree
