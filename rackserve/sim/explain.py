"""Explain a rack-over-rack ratio: walk from scenario A to scenario B one factor at a time and
price throughput/GPU at a target interactivity after each step (a waterfall).

The factors, in order: the workload (so every step serves the same load), hardware, kernel
optimization switches, layouts (the deployment), pool tiers, Engram placement (`timing.engram_placement`,
with the live small model's `engram` section), routing policy. A field a scenario leaves out counts as
its config default, so an explicit default is no step. Pure: scenario mappings in, scenario mappings
out; the CLI runs and plots them.
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
    ("engram placement", "timing", ("engram_placement",)),
    ("routing policy", "routing", ("policy",)),
)
POOL_SIM_KEYS = ("rank_cache_tokens", "decode_kv_tokens_per_rank")  # capacity overrides travel with the pool
TRAVELS_WITH = {"engram placement": "engram"}  # the live small model's Engram sizes go with the placement


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


def ordered_factors(first: list[str] | None = None) -> tuple[tuple[str, str, tuple[str, ...] | None], ...]:
    """FACTORS with the named ones moved to the front, in the order given; ValueError on an unknown name."""
    names = [f for f, _, _ in FACTORS]
    for name in first or []:
        if name not in names:
            raise ValueError(f"order: unknown factor {name!r}; known: {', '.join(names)}")
    head = [next(f for f in FACTORS if f[0] == name) for name in first or []]
    return (*head, *(f for f in FACTORS if f not in head))


def walk(a: dict[str, Any], b: dict[str, Any], first: list[str] | None = None) -> list[Step]:
    """A's scenario, then one step per factor that differs, ending at B's (up to unchanged keys);
    `first` names factors to walk before the others (a factor's share depends on the order)."""
    cur = copy.deepcopy(a)
    cur["name"] = "A"
    steps = [Step("A", str(a.get("name", "A")), copy.deepcopy(cur))]
    for factor, key, inner in ordered_factors(first):
        before, after = _get(cur, key, inner), _get(b, key, inner)
        if _or_default(before, key, inner) == _or_default(after, key, inner):
            continue
        _set(cur, key, inner, after)
        if factor in TRAVELS_WITH:
            _set(cur, TRAVELS_WITH[factor], None, b.get(TRAVELS_WITH[factor]))
        if factor == "pool tiers":
            sim = cur.setdefault("sim", {})
            for k in POOL_SIM_KEYS:
                sim.pop(k, None)
                if k in (b.get("sim") or {}):
                    sim[k] = b["sim"][k]
        cur["name"] = f"step{len(steps)}-{factor.replace(' ', '-')}"
        change = f"{_say(_or_default(before, key, inner))} -> {_say(_or_default(after, key, inner))}"
        steps.append(Step(factor, change, copy.deepcopy(cur)))
    return steps


def _or_default(value: Any, key: str, inner: tuple[str, ...] | None) -> Any:
    """`value`, or the config's default of a one-field factor where the scenario leaves it out."""
    if value is not None or inner is None or len(inner) != 1:
        return value
    from rackserve.config import Config

    section = Config.model_fields.get(key)
    fields = getattr(section.annotation, "model_fields", {}) if section else {}
    field = fields.get(inner[0])
    return None if field is None else field.default


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
