"""The step's critical path from its layer groups' results and token bundles: the slowest rank's
attention part + the busiest EP rank's MoE part, with the breakdown of the critical rank."""

from __future__ import annotations

import numpy as np

from rackserve.timing import pricer
from rackserve.timing.batch import StepCost
from rackserve.timing.layout import Layout
from rackserve.timing.parts import Bundle, label
from rackserve.timing.plan_features import Group


def _assemble_one(g: Group, bundle: Bundle, transfer, lay: Layout) -> StepCost:
    """_assemble of a step of one layer group (decode): the same operations, fewer of them."""
    ra, idle, a_t, i_t, both = critical((g.kv,), transfer, (bundle.attn_total,), (bundle.moe_total,))
    if idle:
        return StepCost(0.0, {}, (0.0,) * lay.dp, {})
    a_c, i_c, a_m, i_m = g.cm_list(ra)
    values, labels = bundle.rank_tail(ra)
    if transfer is None:
        if g.gp.has_indexer:
            breakdown = {"attention": a_t, "indexer": i_t, **values}
            bound = {"attention": "compute" if a_c > a_m else "memory", "indexer": "compute" if i_c > i_m else "memory",
                     **labels}
        else:
            breakdown = {"attention": a_t, **values}
            bound = {"attention": "compute" if a_c > a_m else "memory", **labels}
    else:
        breakdown = {"attention": a_t}
        bound = {"attention": "compute" if a_c > a_m else "memory"}
        if g.gp.has_indexer:
            breakdown["indexer"] = i_t
            bound["indexer"] = "compute" if i_c > i_m else "memory"
        breakdown["kv_transfer"] = float(transfer[ra])
        bound["kv_transfer"] = "comm"
        breakdown.update(values)
        bound.update(labels)
    total = sum(breakdown.values())
    return StepCost(total, breakdown, busy(both, total), bound)


def _assemble(groups, bundles: list[Bundle], transfer, lay: Layout) -> StepCost:
    ra, idle, a_t, i_t, both = critical([g.kv for g in groups], transfer, [b.attn_total for b in bundles],
                                        [b.moe_total for b in bundles])
    if idle:
        return StepCost(0.0, {}, (0.0,) * lay.dp, {})
    if len(groups) == 1:
        a_c, i_c, a_m, i_m = groups[0].cm_list(ra)
    else:
        cm = groups[0].cm_row(ra)
        for g in groups[1:]:
            cm = cm + g.cm_row(ra)
        a_c, i_c, a_m, i_m = cm.tolist()
    breakdown = {"attention": a_t}
    bound = {"attention": "compute" if a_c > a_m else "memory"}
    if any(g.gp.has_indexer for g in groups):
        breakdown["indexer"] = i_t
        bound["indexer"] = "compute" if i_c > i_m else "memory"
    if transfer is not None:
        breakdown["kv_transfer"] = float(transfer[ra])
        bound["kv_transfer"] = "comm"
    values, labels = bundles[0].rank_tail(ra) if len(bundles) == 1 else _merged_tail(bundles, ra)
    breakdown.update(values)
    bound.update(labels)
    total = sum(breakdown.values())
    return StepCost(total, breakdown, busy(both, total), bound)


def _merged_tail(bundles: list[Bundle], ra: int) -> tuple[dict[str, float], dict[str, str]]:
    """Several layer groups (prefill): their components summed at rank ra, compute/memory from the
    summed times, the MoE components labelled by the all-token group. Cached on the first bundle
    (keyed by the others' ids, which the cached entry holds, so an id is never reused for it)."""
    key = ("merged", ra, *map(id, bundles[1:]))
    hit = bundles[0]._rank_views.get(key)
    if hit is not None:
        return hit[1], hit[2]
    values: dict[str, float] = {}
    tc: dict[str, float] = {}
    tm: dict[str, float] = {}
    for b in bundles:
        for acc, part in zip((values, tc, tm), b.rank_view(ra), strict=True):
            for name, value in part.items():
                acc[name] = acc.get(name, 0.0) + value
    labels = {n: label(n, tc, tm) for n in values}
    for b in bundles:
        for name, value in b.crit_breakdown.items():
            values[name] = values.get(name, 0.0) + value
            labels.setdefault(name, b.crit_bound[name])
    bundles[0]._rank_views[key] = (bundles[1:], values, labels)
    return values, labels


def _critical(kvs, transfer, attn_totals, moe_totals) -> tuple:
    """The critical rank of a step from its layer groups' (attention, indexer) times per rank `kvs`, its
    pool transfers (None where none) and its bundles' attention- and MoE-part totals: (ra, idle, its
    attention and indexer times, attention + MoE part per rank), idle where no rank has any time."""
    kv = kvs[0]
    for k in kvs[1:]:
        kv = kv + k
    attn = kv[:, 0] + kv[:, 1]
    if transfer is not None:
        attn = attn + transfer
    moe = moe_totals[0]
    for a in attn_totals:
        attn = attn + a
    for m in moe_totals[1:]:
        moe = moe + m
    ra = int(attn.argmax())
    idle = bool(attn[ra] <= 0 and moe.max() <= 0)
    a_t, i_t = kv[ra].tolist()
    return ra, idle, a_t, i_t, attn + moe


def _busy(both: np.ndarray, total: float) -> tuple:
    """Each rank's busy time: its attention + MoE part, at most the step's."""
    return tuple(np.minimum(both, total).tolist())


# name -> (numpy twin, compiled kernel), as step_plan.KERNELS: the compiled ones where timing/_pricer.c is built
KERNELS = {"critical": (_critical, pricer.critical), "busy": (_busy, pricer.busy)}
critical = KERNELS["critical"][1 if pricer.AVAILABLE else 0]
busy = KERNELS["busy"][1 if pricer.AVAILABLE else 0]
