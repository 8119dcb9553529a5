"""CPU seconds of a process tree by role, read from /proc (Linux): what bench/frontdoor/overhead.py's
cluster spends per request beside its wall time. Every descendant of the launcher counts, by the
first role its command line names; processes that ended between two snapshots are not counted."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

ROLES = (  # (role, a word of its command line), first match wins
    ("router", "services.router"),
    ("prefill service", "services.prefill"),
    ("decode service", "services.decode"),
    ("rank actors", "RankWorker"),
    ("engram shards", "services.engram"),
    ("kv pool", "services.kvpool"),
    ("redis", "redis"),
    ("prometheus", "prometheus"),
    ("ray", "ray"),
)
TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def _stat(pid: str) -> tuple[int, float] | None:
    """(ppid, user + system CPU seconds) of a live process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), (int(fields[11]) + int(fields[12])) * TICK_S


def _role(pid: str) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "other"
    return next((role for role, word in ROLES if word in cmd), "other")


def snapshot(root: int) -> dict[int, tuple[str, float]]:
    """{pid: (role, CPU s)} of `root`'s descendants (root included)."""
    stats = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _stat(p))}
    children: dict[int, list[int]] = defaultdict(list)
    for pid, (ppid, _) in stats.items():
        children[ppid].append(pid)
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            out[pid] = (_role(str(pid)), stats[pid][1])
            todo += children.get(pid, [])
    return out


def per_role_ms(before: dict, after: dict, requests: int) -> dict[str, float]:
    """CPU ms per request by role between two snapshots (and "total")."""
    spent: dict[str, float] = defaultdict(float)
    for pid, (role, cpu_s) in after.items():
        spent[role] += cpu_s - before.get(pid, (role, 0.0))[1]
    out = {role: 1000 * s / requests for role, s in sorted(spent.items(), key=lambda kv: -kv[1])}
    out["total"] = sum(out.values())
    return out
