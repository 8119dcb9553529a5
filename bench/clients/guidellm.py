"""Build guidellm's venv once (torch first, from the machine's local wheel, then guidellm), then
run bench/clients/outside_clients.py, whose table and bench/results/clients/outside_clients.json include guidellm's row.

    .venv/bin/python bench/clients/guidellm.py [bench/clients/outside_clients.py options]
guidellm pulls torch (~1.5 GB installed), so it lives in .venv-guidellm (git-ignored), never in
the project's .venv and never in the test suite.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv-guidellm"
GUIDELLM_VERSION = "0.8.1"
TORCH_VERSION = "2.13.0"  # resolves to the CPU wheel in /opt/wheels on this kind of machine


def ensure_venv() -> None:
    stamp = VENV / f".installed-{GUIDELLM_VERSION}"
    if stamp.exists():
        return
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(VENV / "bin" / "pip"), "install", "-q"]
    subprocess.run([*pip, f"torch=={TORCH_VERSION}"], check=True)
    subprocess.run([*pip, f"guidellm=={GUIDELLM_VERSION}"], check=True)
    stamp.touch()


if __name__ == "__main__":
    ensure_venv()
    sys.exit(subprocess.run([sys.executable, str(REPO / "bench" / "clients" / "outside_clients.py"), *sys.argv[1:]])
             .returncode)
