"""The envelope of a rack as InferenceX draws it: the points that no other point beats on both
throughput per GPU and interactivity, taken over *every* configuration and concurrency
(InferenceX-app `calculateRoofline`), read at a target interactivity and summed into one area.

Points are plain dicts with "throughput_per_gpu", an interactivity key (e.g. "tps_user_p90") and a
"config"; pure functions, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

THROUGHPUT = "throughput_per_gpu"


def envelope(points: Sequence[dict], x: str) -> list[dict]:
    """The non-dominated points over all configurations, by increasing interactivity `x`
    (so by decreasing throughput). A point equal to another on both axes is kept once."""
    usable = [p for p in points if _finite(p.get(x)) and _finite(p.get(THROUGHPUT))]
    best = -math.inf
    out = []
    for p in sorted(usable, key=lambda p: (-p[x], -p[THROUGHPUT])):
        if p[THROUGHPUT] > best:
            out.append(p)
            best = p[THROUGHPUT]
    return out[::-1]


def throughput_at(env: Sequence[dict], target: float, x: str) -> float | None:
    """Throughput/GPU the envelope delivers at interactivity >= `target`: linear between the two
    envelope points around `target`; the envelope's slowest point (its peak) when every point is
    faster than `target`; None when no point reaches `target` (never the peak in its place)."""
    pts = sorted(env, key=lambda p: p[x])
    if not pts or target > pts[-1][x]:
        return None
    if target <= pts[0][x]:
        return pts[0][THROUGHPUT]
    for lo, hi in zip(pts, pts[1:], strict=False):
        if lo[x] <= target <= hi[x]:
            t = (target - lo[x]) / (hi[x] - lo[x])
            return lo[THROUGHPUT] + t * (hi[THROUGHPUT] - lo[THROUGHPUT])
    raise AssertionError("unreachable: target lies inside the envelope's range")


def winner_at(env: Sequence[dict], target: float, x: str) -> dict | None:
    """At `target`: the envelope's throughput (interpolated) and the point that meets the target
    with the most throughput (its configuration is the winner); None when unreachable."""
    value = throughput_at(env, target, x)
    if value is None:
        return None
    meeting = [p for p in env if p[x] >= target]
    best = max(meeting, key=lambda p: p[THROUGHPUT])
    return {"throughput_per_gpu": value, "config": best.get("config"), "point": best}


def area(env: Sequence[dict], lo: float, hi: float, x: str) -> float:
    """Integral of the envelope's throughput over interactivity from `lo` to `hi` (the curve of
    throughput_at, zero past the fastest point): one number per rack or search, in
    (tok/s/GPU) x (tok/s/user)."""
    if hi <= lo or not env:
        return 0.0
    top = max(p[x] for p in env)
    xs = sorted({lo, min(hi, top), *(p[x] for p in env if lo < p[x] < min(hi, top))})
    total = 0.0
    for a, b in zip(xs, xs[1:], strict=False):
        fa, fb = throughput_at(env, a, x), throughput_at(env, b, x)
        total += 0.5 * ((fa or 0.0) + (fb or 0.0)) * (b - a)
    return total


def _finite(v) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)
