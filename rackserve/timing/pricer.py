"""The step pricer's compiled kernels (timing/_pricer.c): the roofline arithmetic over a step's batch
features, one C call where the numpy twins (plan_features.py, step_plan.py: the reference) make 10-30.

Each function here has the signature and the results of its twin, to rounding (the matrix products sum
in another order than BLAS; tests/unit/timing/test_pricer.py holds them to 1e-12 relative). step_plan.py
binds these where the extension is built (`AVAILABLE`), else the twins (an install without a C compiler).
"""

from __future__ import annotations

import numpy as np

from rackserve.timing.plan import GroupPlan, StepPlan
from rackserve.timing.plan_features import Group

try:  # built by `pip install -e .` (setup.py); without a C compiler the numpy twins serve
    from rackserve.timing import _pricer
except ImportError:  # pragma: no cover - exercised where no C compiler is
    _pricer = None

AVAILABLE = _pricer is not None


def general_features(gp: GroupPlan, q: np.ndarray, end: np.ndarray, starts, nonempty, zeros=None) -> np.ndarray:
    """plan_features._general_features: [F_g + 2, R]."""
    starts = np.asarray(starts, dtype=np.intp)
    nonempty = np.asarray(nonempty, dtype=np.bool_)
    out = np.empty((gp.f_order.shape[0], starts.shape[0]))
    _pricer.features(out, np.ascontiguousarray(q, dtype=np.float64), np.ascontiguousarray(end, dtype=np.float64),
                     starts, nonempty, zeros if zeros else None, gp.packed)
    return out


def group_result(gp: GroupPlan, f: np.ndarray) -> Group:
    """One layer group's results from its features f [F_g + 2, R] (step_plan._group_result)."""
    r = f.shape[1]
    kv = np.empty((r, 2))
    cm = np.empty((r, 4))
    _pricer.kv_cm(kv, cm, np.ascontiguousarray(f), gp.general_map, gp.omo, gp.overhead,
                  gp.gather if gp.has_gather else None, gp.weights)
    return Group(gp, kv, None, None, f[-2], f[-1], cm)


def group_results(gp: GroupPlan, fs: list[np.ndarray]) -> list[Group]:
    """group_result of each f of `fs` (step_plan._group_results)."""
    return [group_result(gp, f) for f in fs]


def decode_totals(gp: GroupPlan, cached: np.ndarray, starts: np.ndarray, active) -> np.ndarray:
    """step_plan._decode_totals: a single-token decode step's per-rank totals [R, 7]."""
    out = np.empty((starts.shape[0], 7))
    _pricer.decode_z(out, np.ascontiguousarray(cached, dtype=np.int64), 1, starts, active, gp.decode_caps,
                     gp.decode_map, gp.d_omo, gp.d_out)
    return out


def decode_pass_totals(gp: GroupPlan, cached: np.ndarray, starts: np.ndarray, active) -> np.ndarray:
    """step_plan._decode_pass_totals: decode_totals of each row of cached [k, n], as [k, R, 7]."""
    k = cached.shape[0]
    out = np.empty((k, starts.shape[0], 7))
    _pricer.decode_z(out, np.ascontiguousarray(cached, dtype=np.int64), k, starts, active, gp.decode_caps,
                     gp.decode_map, gp.d_omo, gp.d_out)
    return out


def rank_rows(plan: StepPlan, items: list) -> np.ndarray:
    """step_plan._rank_rows: the rows [len(items), 8] of (group index, rank batch) items."""
    stack = plan.row_stack
    gp0 = plan.groups[0]
    if stack is None:  # groups that do not stack: one at a time, each its own
        return np.concatenate([_rows_of(plan, [it], plan.groups[it[0]]) for it in items])
    return _rows_of(plan, items, gp0)


def _rows_of(plan: StepPlan, items: list, gp: GroupPlan) -> np.ndarray:
    stack = plan.row_stack
    news = [rb.new_tokens for _, rb in items]
    cached = [rb.cached_tokens for _, rb in items]
    sizes = np.fromiter(map(len, news), np.intp, len(news))
    if stack is None:  # a lone group's own map and weights
        gidx = np.zeros(len(items), dtype=np.intp)
        caps = np.array([float(gp.tail) if gp.tail else np.inf])
        maps, weights = gp.general_map, gp.weights
    else:
        gidx = np.fromiter((gi for gi, _ in items), np.intp, len(items))
        caps, maps, weights = stack.caps, stack.maps, stack.weights
    out = np.empty((len(items), 8))
    new = np.concatenate(news) if len(news) > 1 else news[0]
    old = np.concatenate(cached) if len(cached) > 1 else cached[0]
    _pricer.rank_rows(out, np.ascontiguousarray(new, dtype=np.int64), np.ascontiguousarray(old, dtype=np.int64),
                      sizes, gidx, gp.packed, caps, maps, weights, gp.omo, gp.overhead,
                      gp.gather if gp.has_gather else None)
    return out


def critical(kvs, transfer, attn_totals, moe_totals) -> tuple:
    """step_assemble._critical: (ra, idle, a_t, i_t, attention + MoE part per rank)."""
    both = np.empty(attn_totals[0].shape[0])
    ra, idle, a_t, i_t = _pricer.critical(kvs, transfer, attn_totals, moe_totals, both)
    return ra, idle, a_t, i_t, both


def busy(both: np.ndarray, total: float) -> tuple:
    """step_assemble._busy: tuple(min(x, total))."""
    return _pricer.capped(both, total)
