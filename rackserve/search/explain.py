"""Rack over rack on envelopes: walk from rack A to rack B one field at a time and screen the whole
search space at every step, so each step's change of the envelope at a target (and of the winning
deployment) is one factor's share of the ratio. The screen takes seconds per step; the replayed
envelopes of both racks (frontier.json) say how far to trust it."""

from __future__ import annotations

from collections.abc import Sequence

from rackserve.search import envelope as env_math
from rackserve.search.frontier import rack_mix, screen_all, speed_key
from rackserve.search.rack import RackSpec

FIELDS = ("timing.hardware", "timing.optimizations", "timing.model", "timing.engram_placement", "pool", "sim",
          "gpus", "space", "workload")


def _get(rack: RackSpec, field: str):
    head, _, tail = field.partition(".")
    value = getattr(rack, head)
    return value.get(tail) if tail else value


def _set(rack: RackSpec, field: str, value) -> RackSpec:
    head, _, tail = field.partition(".")
    if tail:
        return rack.model_copy(update={head: {**getattr(rack, head), tail: value}})
    return rack.model_copy(update={head: value})


def screened(rack: RackSpec, targets: Sequence[float], x: str) -> dict:
    curves, _ = screen_all(rack, rack_mix(rack))
    pts = [{**p, "config": cfg} for cfg, curve in curves.values() for p in curve]
    env = env_math.envelope(pts, x)
    at = {}
    for t in targets:
        win = env_math.winner_at(env, t, x)
        at[f"{t:g}"] = None if win is None else {"throughput_per_gpu": win["throughput_per_gpu"],
                                                  "config": win["config"]}
    return {"at_target": at, "peak": max((p["throughput_per_gpu"] for p in env), default=0.0)}


def walk_racks(a: RackSpec, b: RackSpec, interactivity: str = "e2e", percentile: str = "p90",
               targets: Sequence[float] | None = None) -> list[dict]:
    x = speed_key(interactivity, percentile)
    targets = list(targets if targets is not None else a.search.targets)
    steps = [{"step": 0, "change": f"{a.name} as it is", **screened(a, targets, x)}]
    cur = a
    for field in FIELDS:
        if _get(cur, field) == _get(b, field):
            continue
        cur = _set(cur, field, _get(b, field))
        steps.append({"step": len(steps), "change": f"{field}: {_get(a, field)} -> {_get(b, field)}",
                      **screened(cur, targets, x)})
    return steps
