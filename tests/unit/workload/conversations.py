"""Small constructed conversations in the data/agentx/README.md format, for the workload tests."""

from __future__ import annotations


def req(t: float, n_in: int, out: int = 10, base: int = 1, think: float | None = None, **extra) -> dict:
    """A request whose hash ids are base, base+1, ... (one per full 64-token block)."""
    r = {"t": t, "type": "n", "in": n_in, "out": out, "hash_ids": list(range(base, base + n_in // 64)),
         "api_time": 1.0}
    if think is not None:
        r["think_time"] = think
    return r | extra


def marker(t: float, status: str, requests: list[dict], agent: str = "a") -> dict:
    return {"t": t, "type": "subagent", "agent_id": agent, "status": status, "requests": requests}


def conversation(requests: list[dict], cid: str = "c0") -> dict:
    return {"id": cid, "block_size": 64, "hash_id_scope": "local", "requests": requests}


def chain(n_turns: int, cid: str = "c0", first: int = 640, grow: int = 128, gap: float = 20.0) -> dict:
    """A parent-only conversation: each turn resends the previous prompt plus `grow` tokens."""
    reqs = [req(i * gap, first + i * grow, think=0.0 if i == 0 else gap - 1.0) for i in range(n_turns)]
    return conversation(reqs, cid)
