"""Recorded agentic conversations (data/agentx/README.md format): parsed and validated, with the
replay-relevant timing of every request worked out once.

A conversation is a sequence of steps: a parent `Turn`, or a `FanOut` of consecutive subagent
markers that all start right after the parent's previous turn ended. A completed subagent gates the
parent's next turn (join); an async_launched one runs beside it and gates nothing.
`parse_conversation(obj, where)` raises ValueError naming the line (`where`) and the bad field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

TRACE_BLOCK_TOKENS = 64  # the capture's block size (data/agentx/README.md: `block_size` 64)
STATUSES = ("completed", "async_launched")


@dataclass(frozen=True, eq=False)
class Turn:
    """One recorded request. `idle_before_s`: the recorded idle between what this turn waits for
    (its agent's previous turn, or the join of a fan-out) and its send, before any cap."""

    t_s: float
    prompt_tokens: int
    output_tokens: int
    hash_ids: np.ndarray = field(repr=False)  # uint64, one per full 64-token block
    idle_before_s: float
    shared_ids: int = 0  # leading hash ids equal to its agent's previous turn's (0 for the first)


@dataclass(frozen=True)
class Subagent:
    agent_id: str
    status: str  # "completed" (gates the parent's next turn) or "async_launched"
    t_s: float  # completion time (completed) or launch time (async) on the parent's clock
    turns: tuple[Turn, ...]

    @property
    def gates(self) -> bool:
        return self.status == "completed"


@dataclass(frozen=True)
class FanOut:
    """Consecutive subagent markers: started together, the parent continues once the gating ones end."""

    subagents: tuple[Subagent, ...]


Step = Turn | FanOut


@dataclass(frozen=True)
class Conversation:
    conv_id: str
    steps: tuple[Step, ...]

    @property
    def parent_turns(self) -> list[int]:
        """Indices into `steps` of the parent's turns."""
        return [i for i, s in enumerate(self.steps) if isinstance(s, Turn)]

    @property
    def duration_s(self) -> float:
        """Recorded time of the parent's last turn (its first is at 0)."""
        turns = [s.t_s for s in self.steps if isinstance(s, Turn)]
        return turns[-1] - turns[0] if turns else 0.0

    def all_turns(self) -> list[Turn]:
        """Every request: parent turns and subagent turns, in step order."""
        out: list[Turn] = []
        for s in self.steps:
            if isinstance(s, Turn):
                out.append(s)
            else:
                out.extend(t for sub in s.subagents for t in sub.turns)
        return out


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common leading run of two id arrays."""
    n = min(a.size, b.size)
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def _number(obj: dict, name: str, where: str, minimum: float = 0.0) -> float:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise ValueError(f"{where}: field '{name}' must be a number >= {minimum:g}, got {value!r}")
    return float(value)


def _count(obj: dict, name: str, where: str) -> int:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: field '{name}' must be an integer >= 0, got {value!r}")
    return value


def _hash_ids(obj: dict, n_in: int, block_tokens: int, where: str) -> np.ndarray:
    ids = obj.get("hash_ids")
    if isinstance(ids, np.ndarray):  # pre-extracted by the fast file reader
        arr = ids
    elif isinstance(ids, list) and all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
        arr = np.asarray(ids, dtype=np.int64)
    else:
        raise ValueError(f"{where}: field 'hash_ids' must be a list of integers")
    if arr.size and arr.min() < 0:
        raise ValueError(f"{where}: field 'hash_ids' must be non-negative")
    if arr.size != n_in // block_tokens:
        raise ValueError(
            f"{where}: field 'hash_ids' has {arr.size} ids, 'in' {n_in} needs {n_in // block_tokens} "
            f"(one per full {block_tokens}-token block)"
        )
    return arr.astype(np.uint64)


def _turn(obj: Any, prev: Turn | None, idle_after: float | None, block_tokens: int, where: str) -> Turn:
    """`idle_after`: when the turn follows a join, the recorded idle after it (else think_time)."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: a request must be a JSON object")
    t = _number(obj, "t", where)
    n_in, n_out = _count(obj, "in", where), _count(obj, "out", where)
    if n_in < 1:
        raise ValueError(f"{where}: field 'in' must be >= 1, got {n_in}")
    ids = _hash_ids(obj, n_in, block_tokens, where)
    if prev is None:
        idle = 0.0
    elif idle_after is not None:
        idle = idle_after
    elif obj.get("think_time") is not None:
        idle = _number(obj, "think_time", where)
    else:
        idle = t - prev.t_s  # README: missing think_time -> the difference of t
    shared = 0 if prev is None else common_prefix(prev.hash_ids, ids)
    # out 0 (a recorded empty answer) is sent as 1 token: a stream needs one
    return Turn(t, n_in, max(1, n_out), ids, max(0.0, idle), shared)


def _subagent(obj: dict, block_tokens: int, where: str) -> Subagent:
    status = obj.get("status")
    if status not in STATUSES:
        raise ValueError(f"{where}: field 'status' must be one of {', '.join(STATUSES)}, got {status!r}")
    reqs = obj.get("requests")
    if not isinstance(reqs, list):
        raise ValueError(f"{where}: field 'requests' of a subagent must be a list")
    turns: list[Turn] = []
    for j, r in enumerate(reqs):
        w = f"{where} requests[{j}]"
        if isinstance(r, dict) and r.get("type") == "subagent":
            raise ValueError(f"{w}: field 'type': subagents nest one level deep only")
        turns.append(_turn(r, turns[-1] if turns else None, None, block_tokens, w))
    return Subagent(str(obj.get("agent_id", "")), status, _number(obj, "t", where), tuple(turns))


def parse_conversation(obj: Any, where: str) -> Conversation:
    """One JSONL line's object; ValueError names `where` and the bad field."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    block_tokens = obj.get("block_size", TRACE_BLOCK_TOKENS)
    if block_tokens != TRACE_BLOCK_TOKENS:
        raise ValueError(f"{where}: field 'block_size' must be {TRACE_BLOCK_TOKENS}, got {block_tokens!r}")
    reqs = obj.get("requests")
    if not isinstance(reqs, list) or not reqs:
        raise ValueError(f"{where}: field 'requests' must be a non-empty list")
    steps: list[Step] = []
    group: list[Subagent] = []
    prev: Turn | None = None
    for i, r in enumerate(reqs):
        w = f"{where} requests[{i}]"
        if isinstance(r, dict) and r.get("type") == "subagent":
            group.append(_subagent(r, block_tokens, w))
            continue
        idle_after = None
        if group:
            steps.append(FanOut(tuple(group)))
            joined = [s.t_s for s in group if s.gates]
            if joined and isinstance(r, dict) and isinstance(r.get("t"), int | float):
                idle_after = max(0.0, float(r["t"]) - max(joined))
            group = []
        turn = _turn(r, prev, idle_after, block_tokens, w)
        steps.append(turn)
        prev = turn
    if group:
        steps.append(FanOut(tuple(group)))
    if not any(isinstance(s, Turn) for s in steps):
        raise ValueError(f"{where}: field 'requests' has no parent request")
    return Conversation(str(obj.get("id", where)), tuple(steps))
