"""The step costs a run priced, kept on disk, so that the next run of the same cost model (another
process, another search, a user's second `rackserve sim`) starts with them instead of pricing them
again. A first run of the Mooncake trace spends about two thirds of its time pricing steps
(bench/results/simulator/speed_bounds.json); the next run that finds them here does not.

The library uses the directory in $RACKSERVE_STEP_STORE (rackserve.sim.run.shared_timing and
keep_steps), none where it is unset; `rackserve sim` and `rackserve sim frontier` set it (OUT/step-store
unless --step-store DIR or --no-step-store), so that a search's Ray workers inherit it. One file per cost
model, named by a fingerprint of everything a priced step depends on: the timing section, the router's
reference chunk, the memo's grid, numpy's version and the source of the timing model and the memo.
A code change therefore starts a new file instead of reading stale prices. The figures of a run are
the same with or without the store: a stored entry is the memo entry the run would have computed.

The files are pickles read by an unpickler that builds nothing but the memo's own value type
(StepCost); a file that is not one of ours, or is damaged, is skipped with a warning and replaced at
the next save. Writers (a search's workers) take a lock and merge with what the file holds.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import logging
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from rackserve.timing.batch import StepCost

ENV = "RACKSERVE_STEP_STORE"
FORMAT = 1
_PKG = Path(__file__).resolve().parents[1]
_CODE = (_PKG / "timing", _PKG / "sim" / "step_cache.py")
_ALLOWED = {("rackserve.timing.batch", "StepCost")}
_VALUES = {"steps": lambda v: isinstance(v, StepCost), "estimates": lambda v: isinstance(v, float),
           "ratios": lambda v: isinstance(v, float),
           "plains": lambda v: isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], float)}
log = logging.getLogger(__name__)
_code_hash: str | None = None


def code_version() -> str:
    """A hash of the timing model's and the memo's source (and spec files): what the prices come from."""
    global _code_hash
    if _code_hash is None:
        h = hashlib.sha256()
        files: list[Path] = []
        for root in _CODE:
            files += sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".py", ".yaml", ".json")) \
                if root.is_dir() else [root]
        for p in files:
            h.update(str(p.relative_to(_PKG)).encode() + b"\0" + p.read_bytes() + b"\0")
        _code_hash = h.hexdigest()
    return _code_hash


def fingerprint(timing_section_json: str, chunk_tokens: int, grid: tuple) -> str:
    """The store file's name for one cost model (see the module docstring)."""
    h = hashlib.sha256()
    for part in (str(FORMAT), timing_section_json, str(chunk_tokens), repr(grid), np.__version__, code_version()):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:32]


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a step store")
        return super().find_class(module, name)


def _read(path: Path, key: str) -> dict[str, dict] | None:
    """The entries of the store file at `path`, or None (absent, not ours, damaged: warned)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        doc = _Unpickler(io.BytesIO(data)).load()
        if not (isinstance(doc, dict) and doc.get("format") == FORMAT and doc.get("key") == key
                and isinstance(doc.get("entries"), dict) and set(doc["entries"]) <= set(_VALUES)
                and all(isinstance(t, dict) and all(map(_VALUES[n], t.values())) for n, t in doc["entries"].items())):
            raise ValueError("not a step store file of this format and key")
        return doc["entries"]
    except Exception as exc:  # noqa: BLE001  a cache never fails a run: skip it, the next save replaces it
        log.warning("step store %s skipped: %s", path, exc)
        return None


class StepStore:
    """Step costs on disk for CachedTiming (rackserve/sim/step_cache.py), one file per fingerprint."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise ValueError(f"step store: {self.directory} is not a directory")

    def path(self, key: str) -> Path:
        return self.directory / f"steps-{key}.pkl"

    def load(self, timing: Any, key: str) -> int:
        """Put the stored entries into `timing`'s memo (what it holds already stays); how many were new."""
        timing.store_stamp = self.stamp(key)
        entries = _read(self.path(key), key)
        new = 0 if entries is None else timing.absorb(entries)
        timing.stored_size += new  # what it priced itself stays unsaved
        return new

    def stamp(self, key: str) -> tuple[int, int] | None:
        """(modification time, size) of the store file, None where there is none: whether it changed."""
        try:
            st = self.path(key).stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def refresh(self, timing: Any, key: str) -> int:
        """`load` again where the file changed since `timing` last read or wrote it (another worker of
        a search saved what it priced); 0 without reading where it did not."""
        if self.stamp(key) == timing.store_stamp:
            return 0
        return self.load(timing, key)

    def save(self, timing: Any, key: str) -> int:
        """Merge `timing`'s memo into the store file under a lock (atomic replace); the entries written."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(key)
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            merged = _read(path, key) or {}
            for name, table in timing.entries().items():
                merged.setdefault(name, {}).update(table)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".steps-", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    pickle.dump({"format": FORMAT, "key": key, "entries": merged}, f, protocol=pickle.HIGHEST_PROTOCOL)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            timing.absorb(merged)  # what other writers had stored, now ours too
            timing.store_stamp = self.stamp(key)
            timing.stored_size = timing.size()
        return sum(len(t) for t in merged.values())


def from_env() -> StepStore | None:
    """The store named by $RACKSERVE_STEP_STORE, or None when it is unset or empty."""
    directory = os.environ.get(ENV, "").strip()
    return StepStore(directory) if directory else None
