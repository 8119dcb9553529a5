"""Which configurations and concurrencies to confirm by replay: those the screen puts on its
envelope where the answer is read (at each target, at the peak), with neighbours that bracket each
target, then runners-up and the rest of the envelope (spread evenly along interactivity), in that
order, until the CPU budget is spent.

The cost of a replay point is predicted from the screen's request rate (a discrete-event run costs
roughly a fixed CPU time per request it simulates; `CPU_S_PER_REQUEST` is measured on this machine
by the committed AgentX points and refined by the points a search has already run).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rackserve.search.envelope import THROUGHPUT, envelope

# CPU s per request the replay simulates, warm-up included, on this machine: the 19 replays of a
# fresh nvl72-vr200 search on code 7f924d5 (2026-12-06) cost 0.85 ms per request in all (0.83-0.97 ms
# on the Wide-EP points of 250k-550k requests); the 27 of nvl72-gb300, 1.02 ms. (2026-12-05, code of
# issues 31/32: 1.4 ms.) A search refines it from its own points (frontier._cpu_per_request) before
# it plans the runners-up and the rest.
CPU_S_PER_REQUEST = 0.9e-3
CPU_S_PER_POINT = 6.0  # reading and hashing the trace, building the simulator
FLANKS = (0.8, 1.25)  # lanes around a target's crossing, so the replays bracket it
MIN_WINDOW_S = 120.0  # shortest replay window a cut may give: the release transient is ~10-20 s
CLOSE = 0.15  # a target is pinned once two replays bracket it within 15% of lanes
STEP = 1.3  # an unbracketed target's next replay moves lanes by at least this factor
SAFE = 0.25  # a bracketed target's next replay lies at least this far into the bracket (log-lanes)


@dataclass(frozen=True)
class Candidate:
    config: dict  # Config.to_dict()
    concurrency: int
    why: str
    est_cpu_s: float
    window_s: float = 0.0  # the replay's measured window (simulated s)

    @property
    def key(self) -> tuple[str, int]:
        return self.config["label"], self.concurrency


def crossing(curve: Sequence[dict], target: float, x: str) -> int | None:
    """Lanes at which a configuration's curve falls to `target` interactivity (interpolated on
    the two points around it); None when the curve never reaches it."""
    pts = sorted(curve, key=lambda p: p["concurrency"])
    if not pts or pts[0][x] < target:
        return None
    for lo, hi in zip(pts, pts[1:], strict=False):
        if lo[x] >= target > hi[x]:
            t = (lo[x] - target) / (lo[x] - hi[x])
            return int(round(lo["concurrency"] + t * (hi["concurrency"] - lo["concurrency"])))
    return pts[-1]["concurrency"]


def _rate_at(curve: Sequence[dict], lanes: int) -> float:
    pts = sorted(curve, key=lambda p: p["concurrency"])
    best = min(pts, key=lambda p: abs(p["concurrency"] - lanes))
    return best["requests_per_s"] * min(lanes / max(best["concurrency"], 1), 1.0)


def plan(curves: dict[str, tuple[dict, list[dict]]], targets: Sequence[float], x: str, window_s: float,
         cpu_s_per_request: float = CPU_S_PER_REQUEST, max_point_cpu_s: float | None = None,
         min_window_s: float = MIN_WINDOW_S, warmup_s: float = 0.0) -> list[Candidate]:
    """Replay candidates by priority. `curves`: label -> (config dict, screen points). With
    `max_point_cpu_s`, a point whose full window would cost more gets a window cut to fit (never
    under `min_window_s`); the point records its window."""
    pts = [{**p, "label": label} for label, (_, curve) in curves.items() for p in curve]
    env = envelope(pts, x)
    out: list[Candidate] = []

    def add(label: str, lanes: int | None, why: str) -> None:
        if lanes is None or lanes < 1:
            return
        cand = _candidate(curves[label], lanes, why, window_s, cpu_s_per_request, max_point_cpu_s,
                          min_window_s, warmup_s)
        if all(c.key != cand.key for c in out):
            out.append(cand)

    winners = {t: _best_at(pts, t, x) for t in targets}
    peak = max(env, key=lambda p: p[THROUGHPUT]) if env else None
    for t, label in winners.items():
        if label:
            add(label, crossing(curves[label][1], t, x), f"wins at {t:g} (screen)")
    if peak:
        add(peak["label"], peak["concurrency"], "peak (screen)")
    for t, label in winners.items():
        if label:
            c = crossing(curves[label][1], t, x)
            for f in FLANKS:
                add(label, c and round(c * f), f"brackets {t:g}")
    for t in targets:
        second = _best_at([p for p in pts if p["label"] != winners.get(t)], t, x)
        if second:
            add(second, crossing(curves[second][1], t, x), f"runner-up at {t:g} (screen)")
    if peak:
        add(peak["label"], round(peak["concurrency"] * 0.7), "below the peak")
        second = max((p for p in pts if p["label"] != peak["label"]), key=lambda p: p[THROUGHPUT], default=None)
        if second:
            add(second["label"], second["concurrency"], "runner-up peak (screen)")
    along = sorted(env, key=lambda p: p[x])
    for i in spread(len(along)):  # the rest of the envelope, evenly along interactivity first
        add(along[i]["label"], along[i]["concurrency"], "on the screen's envelope")
    return out


def spread(n: int) -> list[int]:
    """0..n-1 in van der Corput order (0, n/2, n/4, 3n/4, ...): any prefix covers the range
    roughly evenly, so a budget that stops part-way still confirms points along the whole curve."""
    out: list[int] = []
    seen: set[int] = set()
    k = 0
    while len(out) < n:
        v, f, m = 0.0, 0.5, k
        while m:
            v += f * (m & 1)
            m >>= 1
            f /= 2
        i = min(int(v * n), n - 1)
        if i not in seen:
            seen.add(i)
            out.append(i)
        k += 1
    return out


def _candidate(curve: tuple[dict, list[dict]], lanes: int, why: str, window_s: float, cpu_s_per_request: float,
               max_point_cpu_s: float | None, min_window_s: float, warmup_s: float) -> Candidate:
    """A replay of `curve`'s configuration at `lanes`, its window cut to fit `max_point_cpu_s`."""
    cfg, pts = curve
    rate = _rate_at(pts, lanes)
    win = window_s
    if max_point_cpu_s is not None:  # a point too dear for the full window gets a shorter one
        fits = (max_point_cpu_s - CPU_S_PER_POINT) / (cpu_s_per_request * rate) - warmup_s
        win = min(window_s, max(min_window_s, fits))
    est = CPU_S_PER_POINT + cpu_s_per_request * rate * (win + warmup_s)
    return Candidate(cfg, int(lanes), why, est, float(win))


def refine(curves: dict[str, tuple[dict, list[dict]]], replays: Sequence[dict], targets: Sequence[float], x: str,
           window_s: float, cpu_s_per_request: float = CPU_S_PER_REQUEST, max_point_cpu_s: float | None = None,
           min_window_s: float = MIN_WINDOW_S, warmup_s: float = 0.0, close: float = CLOSE) -> list[Candidate]:
    """The next replays that pin each target down on the replayed curves: for the screen's winner at
    a target and the replayed envelope's, the lanes where that configuration's *replayed* curve
    crosses the target. Bracketed by two replays whose lanes differ by more than `close`: their
    log-lanes secant. Not yet bracketed: the screen's crossing corrected by the replay's own error
    (target x screen/replay at the nearest replayed point), or with two replays on the same side their
    own log-lanes secant extrapolated; at least a step of `STEP` past the nearest, at most `STEP`**3.
    Nothing when every target is bracketed closely enough or a configuration cannot reach it."""
    ok = [r for r in replays if r.get("completed") and r.get("valid") is not False and r.get(x) is not None]
    out: list[Candidate] = []
    for t in targets:
        labels = {_best_at([{**p, "label": lab} for lab, (_, c) in curves.items() for p in c], t, x)}
        meeting = [r for r in ok if r[x] >= t]
        if meeting:
            labels.add(max(meeting, key=lambda r: r[THROUGHPUT])["config"]["label"])
        for label in sorted(lab for lab in labels if lab in curves):
            lanes = _next_lanes(curves[label][1], [r for r in ok if r["config"]["label"] == label], t, x, close)
            if lanes is None:
                continue
            cand = _candidate(curves[label], lanes, f"pins {t:g} (replay)", window_s, cpu_s_per_request,
                              max_point_cpu_s, min_window_s, warmup_s)
            if all(c.key != cand.key for c in out) and all(
                    (r["config"]["label"], r["concurrency"]) != cand.key for r in replays):
                out.append(cand)
    return out


def _next_lanes(curve: Sequence[dict], pts: Sequence[dict], t: float, x: str, close: float) -> int | None:
    if not pts:
        return None
    fast = [p for p in pts if p[x] >= t]
    slow = [p for p in pts if p[x] < t]
    if fast and slow:
        a = max(fast, key=lambda p: p["concurrency"])
        above = [p for p in slow if p["concurrency"] > a["concurrency"]]
        if not above:
            return None  # not monotone in lanes (noise): the envelope reads what there is
        b = min(above, key=lambda p: p["concurrency"])
        if b["concurrency"] <= a["concurrency"] * (1 + close):
            return None
        la, lb = math.log(a["concurrency"]), math.log(b["concurrency"])
        # the secant, kept in the bracket's middle half (log-lanes) so that a curve bending sharply
        # near one end (a knee) cannot make the rounds creep from one side: each round cuts the
        # bracket by at least a quarter
        f = min(max((a[x] - t) / (a[x] - b[x]), SAFE), 1 - SAFE)
        lanes = math.exp(la + f * (lb - la))
        lo, hi = a["concurrency"] * (1 + close / 3), b["concurrency"] / (1 + close / 3)
        return int(round(min(max(lanes, lo), hi)))
    side = sorted(slow or fast, key=lambda p: p["concurrency"], reverse=not slow)  # nearest the target first
    near = side[0]
    lanes = near["concurrency"]
    guess = None
    far = next((p for p in side[1:] if p[x] != near[x]), None)
    if far is not None:  # two replays on this side: their own log-lanes secant, extrapolated
        slope = (near[x] - far[x]) / (math.log(lanes) - math.log(far["concurrency"]))
        if slope < 0:
            guess = math.exp(math.log(lanes) + (t - near[x]) / slope)
    if guess is None:  # one replay: the screen's crossing corrected by the replay's error there
        predicted = _interp_x(curve, lanes, x)
        goal = t * predicted / near[x] if near[x] > 0 else None  # the screen's value that means t in replay
        guess = crossing(curve, goal, x) if goal else None
    if slow:  # too slow everywhere: fewer lanes
        if lanes <= 1:
            return None
        step = lanes / STEP
        guess = step if guess is None or guess >= step else max(guess, lanes / STEP**3)
        return max(1, int(round(guess)))
    step = lanes * STEP  # fast everywhere: more lanes
    guess = step if guess is None or guess <= step else min(guess, lanes * STEP**3)
    return int(round(guess))


def _interp_x(curve: Sequence[dict], lanes: int, x: str) -> float:
    pts = sorted(curve, key=lambda p: p["concurrency"])
    xs = [math.log(max(p["concurrency"], 1)) for p in pts]
    ys = [p[x] for p in pts]
    return float(np.interp(math.log(max(lanes, 1)), xs, ys))


def _best_at(pts: Sequence[dict], target: float, x: str) -> str | None:
    meeting = [p for p in pts if p[x] >= target]
    return max(meeting, key=lambda p: p[THROUGHPUT])["label"] if meeting else None


def within_budget(cands: Sequence[Candidate], budget_cpu_s: float | None, done: set[tuple[str, int]]) -> list[Candidate]:
    """The candidates not yet run, in priority order, whose predicted CPU fits the budget."""
    out, spent = [], 0.0
    for c in cands:
        if c.key in done:
            continue
        if budget_cpu_s is not None and spent + c.est_cpu_s > budget_cpu_s:
            continue
        out.append(c)
        spent += c.est_cpu_s
    return out
