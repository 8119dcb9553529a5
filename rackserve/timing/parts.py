"""Per-component times of one step, as arrays over ranks, and the memoized token-count bundle of
one layer group (components that depend only on the per-rank token counts)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

ATTN_PART = (
    "attn_proj",
    "indexer",
    "attention",
    "mhc",
    "all_reduce",
    "engram",
    "lm_head",
    "kv_transfer",
    "host_overhead",
)
MOE_PART = ("gate", "dispatch_combine", "moe_gemm", "shared_expert", "dense_mlp")
HOST = "host_overhead"  # the engine's per-step host work (attention_cost.host_overhead)
COMM = {"all_reduce", "dispatch_combine", "engram", "kv_transfer"}


class Parts:
    """Per-component time, compute time and memory time, each an array over ranks."""

    def __init__(self, ranks: int) -> None:
        self.t: dict[str, np.ndarray] = {}
        self.tc: dict[str, np.ndarray] = {}
        self.tm: dict[str, np.ndarray] = {}
        self.zero = np.zeros(ranks)

    def add(self, name: str, t, tc=None, tm=None, times: float = 1.0) -> None:
        for acc, value in ((self.t, t), (self.tc, tc), (self.tm, tm)):
            if value is None:
                continue
            value = np.asarray(value, dtype=np.float64)
            if times != 1.0:
                value = value * times
            prev = acc.get(name)
            if prev is not None:
                acc[name] = prev + value
            elif value.shape == self.zero.shape:  # a first add is the value itself (0 + x == x)
                acc[name] = value
            else:
                acc[name] = value + self.zero

    def merge(self, other: Parts) -> None:
        for name, t in other.t.items():
            self.add(name, t, other.tc.get(name), other.tm.get(name))

    def total(self, names: tuple[str, ...]) -> np.ndarray:
        out = self.zero
        for n in names:
            if n in self.t:
                out = out + self.t[n]
        return out


@dataclass(frozen=True)
class Bundle:
    """The token-count-only components of one layer group, with their per-rank totals."""

    parts: Parts
    crit: Parts
    attn_total: np.ndarray
    moe_total: np.ndarray
    crit_breakdown: dict[str, float]
    crit_bound: dict[str, str]
    _rank_views: dict = field(default_factory=dict, compare=False, repr=False)

    def rank_view(self, r: int) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
        """(time, compute time, memory time) per attention-part component of rank r (cached)."""
        view = self._rank_views.get(r)
        if view is None:
            p = self.parts
            names = [n for n in p.t if n not in MOE_PART]
            view = (
                {n: float(p.t[n][r]) for n in names},
                {n: float(p.tc[n][r]) for n in names if n in p.tc},
                {n: float(p.tm[n][r]) for n in names if n in p.tm},
            )
            self._rank_views[r] = view
        return view

    def rank_tail(self, r: int) -> tuple[dict[str, float], dict[str, str]]:
        """(time, bound) per component of this bundle alone on the critical path through rank r:
        rank r's attention-part components, then the busiest EP rank's MoE components (cached)."""
        tail = self._rank_views.get(("tail", r))
        if tail is None:
            t, tc, tm = self.rank_view(r)
            bound = {n: label(n, tc, tm) for n in t}
            values = dict(t)
            for name, value in self.crit_breakdown.items():
                values[name] = values.get(name, 0.0) + value
                bound[name] = self.crit_bound[name]
            tail = self._rank_views[("tail", r)] = (values, bound)
        return tail

    @staticmethod
    def of(parts: Parts, crit: Parts) -> Bundle:
        names = [n for n in MOE_PART if n in crit.t]
        return Bundle(
            parts,
            crit,
            parts.total(ATTN_PART),
            parts.total(MOE_PART),
            {n: float(crit.t[n][0]) for n in names},
            {n: _bound(n, crit, 0) for n in names},
        )


def _bound(name: str, parts: Parts, r: int) -> str:
    if name in COMM:
        return "comm"
    if name == HOST:
        return "host"
    tc = parts.tc.get(name)
    tm = parts.tm.get(name)
    if tc is None and tm is None:
        return "memory"
    c = float(tc[r]) if tc is not None else 0.0
    mm = float(tm[r]) if tm is not None else 0.0
    return "compute" if c > mm else "memory"


def label(name: str, tc: dict[str, float], tm: dict[str, float]) -> str:
    """'comm' for communication, else whichever of compute and memory time is larger."""
    if name in COMM:
        return "comm"
    if name == HOST:
        return "host"
    return "compute" if tc.get(name, 0.0) > tm.get(name, 0.0) else "memory"
