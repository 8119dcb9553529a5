"""InferenceX-style curves: the Pareto frontier of throughput per GPU against interactivity
(tok/s/user), a frontier's throughput at a target interactivity (interpolated), and where to sample
concurrency next (from 1 lane until throughput stops growing, then bisecting where the curve bends).

Points are plain dicts with "concurrency", "throughput_per_gpu" and the interactivity keys
"user_tps_p50" / "user_tps_p90" (a SimResult.to_dict() row); pure functions, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

SATURATION_GAIN = 1.05  # a concurrency step that adds less than 5% throughput: saturated
BEND_CHANGE = 0.15  # bisect a step whose throughput or interactivity changes by more than 15%


def pareto(points: Sequence[dict], x: str = "user_tps_p50") -> list[dict]:
    """Points no other point beats on both throughput/GPU and `x`, by increasing `x`."""
    usable = [p for p in points if _finite(p.get(x)) and _finite(p.get("throughput_per_gpu"))]
    best = -math.inf
    out = []
    for p in sorted(usable, key=lambda p: (-p[x], -p["throughput_per_gpu"])):
        if p["throughput_per_gpu"] > best:
            out.append(p)
            best = p["throughput_per_gpu"]
    return sorted(out, key=lambda p: p[x])


def throughput_at(frontier: Sequence[dict], target: float, x: str = "user_tps_p50") -> float | None:
    """Best throughput/GPU of a frontier with interactivity at least `target`: interpolated linearly
    between the two neighbours around `target`; the frontier's slowest point (its peak) when every
    point is faster than `target`; None when no point reaches `target`."""
    pts = sorted(frontier, key=lambda p: p[x])
    if not pts or target > pts[-1][x]:
        return None
    if target <= pts[0][x]:
        return pts[0]["throughput_per_gpu"]
    for lo, hi in zip(pts, pts[1:], strict=False):
        if lo[x] <= target <= hi[x]:
            t = (target - lo[x]) / (hi[x] - lo[x])
            return lo["throughput_per_gpu"] + t * (hi["throughput_per_gpu"] - lo["throughput_per_gpu"])
    raise AssertionError("unreachable: target lies inside the frontier's range")


def first_grid(low: int, high: int, factor: int = 4) -> list[int]:
    """The first round: low, low*factor, ... up to high (high included)."""
    out, c = [], max(low, 1)
    while c < high:
        out.append(c)
        c *= factor
    out.append(high)
    return sorted(set(out))


def saturated_at(points: Sequence[dict]) -> int | None:
    """Concurrency of the first point whose throughput is < SATURATION_GAIN x the previous one's."""
    pts = sorted(points, key=lambda p: p["concurrency"])
    for prev, cur in zip(pts, pts[1:], strict=False):
        if cur["throughput_per_gpu"] < SATURATION_GAIN * prev["throughput_per_gpu"]:
            return cur["concurrency"]
    return None


def next_concurrencies(points: Sequence[dict], x: str = "user_tps_p50") -> list[int]:
    """Concurrencies to run next: the geometric midpoint of every step up to saturation whose
    throughput per lane or interactivity changes by more than BEND_CHANGE (where the curve bends;
    while the rack keeps up both stay flat)."""
    pts = sorted(points, key=lambda p: p["concurrency"])
    stop = saturated_at(pts)
    have = {p["concurrency"] for p in pts}
    out = []
    for lo, hi in zip(pts, pts[1:], strict=False):
        if stop is not None and lo["concurrency"] >= stop:
            break
        mid = round(math.sqrt(lo["concurrency"] * hi["concurrency"]))
        if mid in have or mid <= lo["concurrency"] or mid >= hi["concurrency"]:
            continue
        if _change(_per_lane(lo), _per_lane(hi), "per_lane") > BEND_CHANGE or _change(lo, hi, x) > BEND_CHANGE:
            out.append(mid)
    return out


def _per_lane(p: dict) -> dict:
    """Throughput per lane: constant while the system keeps up (no bend), falling once it saturates."""
    return {"per_lane": p["throughput_per_gpu"] / max(p["concurrency"], 1)}


def _change(a: dict, b: dict, key: str) -> float:
    va, vb = a.get(key), b.get(key)
    if not (_finite(va) and _finite(vb)) or max(abs(va), abs(vb)) == 0:
        return 0.0
    return abs(vb - va) / max(abs(va), abs(vb))


def _finite(v) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)
