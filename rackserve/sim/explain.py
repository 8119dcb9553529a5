"""Explain a rack-over-rack ratio: walk from scenario A to scenario B one factor at a time and
price throughput/GPU at a target interactivity after each step (a waterfall).

The factors, in order: the workload (so every step serves the same load), hardware, kernel
optimization switches, layouts (the deployment), pool tiers, Engram placement, routing policy.
Pure: scenario mappings in, scenario mappings out; the CLI runs and plots them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# (factor, the top-level scenario keys it replaces, the nested keys inside them; None = whole key)
FACTORS: tuple[tuple[str, str, tuple[str, ...] | None], ...] = (
    ("workload", "workload", None),
    ("hardware", "timing", ("hardware",)),
    ("optimizations", "timing", ("optimizations",)),
    ("layouts", "deployment", None),
    ("pool tiers", "pool", None),
    ("engram placement", "engram", None),
    ("routing policy", "routing", ("policy",)),
)
POOL_SIM_KEYS = ("rank_cache_tokens", "decode_kv_tokens_per_rank")  # capacity overrides travel with the pool


@dataclass(frozen=True)
class Step:
    factor: str
    change: str  # "a -> b" in words
    scenario: dict[str, Any]


def read_scenario_dict(path: str | Path) -> dict[str, Any]:
    """A scenario file as a mapping, with a relative trace path made absolute (steps live elsewhere)."""
    path = Path(path)
    data = yaml.safe_load(path.read_text()) or {}
    wl = data.get("workload")
    if isinstance(wl, dict) and isinstance(wl.get("trace"), str) and not Path(wl["trace"]).is_absolute():
        wl["trace"] = str((path.parent / wl["trace"]).resolve())
    return data


def walk(a: dict[str, Any], b: dict[str, Any]) -> list[Step]:
    """A's scenario, then one step per factor that differs, ending at B's (up to unchanged keys)."""
    cur = copy.deepcopy(a)
    cur["name"] = "A"
    steps = [Step("A", str(a.get("name", "A")), copy.deepcopy(cur))]
    for factor, key, inner in FACTORS:
        before, after = _get(cur, key, inner), _get(b, key, inner)
        if before == after:
            continue
        _set(cur, key, inner, after)
        if factor == "pool tiers":
            sim = cur.setdefault("sim", {})
            for k in POOL_SIM_KEYS:
                sim.pop(k, None)
                if k in (b.get("sim") or {}):
                    sim[k] = b["sim"][k]
        cur["name"] = f"step{len(steps)}-{factor.replace(' ', '-')}"
        steps.append(Step(factor, f"{_say(before)} -> {_say(after)}", copy.deepcopy(cur)))
    return steps


def _get(data: dict, key: str, inner: tuple[str, ...] | None) -> Any:
    node = data.get(key)
    if inner is None:
        return node
    for part in inner:
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _set(data: dict, key: str, inner: tuple[str, ...] | None, value: Any) -> None:
    if inner is None:
        if value is None:
            data.pop(key, None)
        else:
            data[key] = copy.deepcopy(value)
        return
    node = data.setdefault(key, {})
    for part in inner[:-1]:
        node = node.setdefault(part, {})
    if value is None:
        node.pop(inner[-1], None)
    else:
        node[inner[-1]] = copy.deepcopy(value)


def _say(value: Any) -> str:
    if value is None:
        return "default"
    if isinstance(value, str | int | float):
        return str(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    return text if len(text) <= 80 else text[:77] + "..."
