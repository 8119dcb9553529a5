"""Every field of a StepCost as exact hex, for tests that hold a fast pricing path to its reference."""

from __future__ import annotations


def cost_bits(cost) -> tuple | str:
    """Every field of a StepCost (or a float), floats as their exact hex (so -0.0 != 0.0), dicts in order."""
    if isinstance(cost, float):
        return cost.hex()
    return (
        cost.total_s.hex(),
        [(k, float(v).hex()) for k, v in cost.breakdown.items()],
        [float(b).hex() for b in cost.rank_busy_s],
        list(cost.bound.items()),
        [(k, float(v).hex()) for k, v in cost.hidden_s.items()],
        float(cost.accepted_tokens).hex(),
    )
