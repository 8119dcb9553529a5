#!/usr/bin/env bash
# Fill deploy/docker/wheels/ with every wheel the image needs (the project's dependencies at the
# versions pinned in .venv, plus the build backend), so `docker build --build-arg OFFLINE_WHEELS=1`
# works where the build containers cannot reach PyPI. Run on a Linux x86_64 host with Python 3.11.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
DEST=deploy/docker/wheels
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$PY" - >"$tmp/req.txt" <<'PYEOF'
import tomllib
with open("pyproject.toml", "rb") as f:
    data = tomllib.load(f)
print("\n".join(data["project"]["dependencies"] + data["build-system"]["requires"]))
PYEOF
"$PY" -m pip freeze --exclude-editable | grep -v '^-e ' >"$tmp/constraints.txt"
# The local base image has Debian bookworm's Python 3.11.2, where redis needs async-timeout
# (marker python_full_version < "3.11.3"); pip download evaluates markers for the host's Python.
echo "async-timeout>=4.0.3" >>"$tmp/req.txt"
nice -n 19 "$PY" -m pip download -q --dest "$DEST" -c "$tmp/constraints.txt" -r "$tmp/req.txt" pip
ls "$DEST"/*.whl | wc -l
