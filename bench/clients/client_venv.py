"""A load client's own venv, built once from PyPI (and the machine's local wheels), outside the
project's .venv: the client's dependencies (torch, an HTTP stack of other versions) stay out of
the project. The venv lives in the user's cache; `REPO/.venv-NAME` (git-ignored) points at it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rackserve"


def ensure(name: str, version: str, steps: list[list[str]]) -> Path:
    """Build `venv-NAME-VERSION` with one `pip install` per step (unless its stamp is there), link
    `.venv-NAME` to it, and return the link."""
    venv, link = CACHE / f"venv-{name}-{version}", REPO / f".venv-{name}"
    stamp = venv / f".installed-{version}"
    if not stamp.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        for step in steps:
            subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *step], check=True)
        stamp.touch()
    if link.resolve() != venv.resolve():
        if link.is_symlink():
            link.unlink()
        link.symlink_to(venv)
    return link
