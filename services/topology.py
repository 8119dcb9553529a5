"""The live cluster's instances and ranks, named the same way by the router, workers and events.

Names: `prefill-dep2-0`, `decode-wide-ep-0`, `decode-tp8-0`, ... (role, layout, index per layout).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rackserve.config import Config, InstanceGroup
from rackserve.metrics import RankKey

Role = Literal["prefill", "decode"]


@dataclass(frozen=True)
class InstanceSpec:
    """One engine instance: its name, layout, GPUs it emulates and DP ranks it runs."""

    name: str
    role: Role
    layout: str
    gpus: int
    dp_ranks: int

    def ranks(self) -> list[RankKey]:
        """Its DP ranks' label sets (RankKey.engine is each rank's vLLM `engine`)."""
        return [RankKey(self.name, r, self.role) for r in range(self.dp_ranks)]


def instances(cfg: Config, role: Role) -> list[InstanceSpec]:
    groups: list[InstanceGroup] = (
        cfg.deployment.prefill if role == "prefill" else cfg.deployment.decode
    )
    seen: dict[str, int] = {}
    out: list[InstanceSpec] = []
    for group in groups:
        for _ in range(group.count):
            index = seen.get(group.layout, 0)
            seen[group.layout] = index + 1
            out.append(
                InstanceSpec(
                    f"{role}-{group.layout}-{index}", role, group.layout, group.gpus, group.dp_ranks
                )
            )
    return out


def running_at_start(cfg: Config, role: Role) -> list[InstanceSpec]:
    """The instances a worker starts: all of them, or under a planner (issue 52) the first
    planner.initial_<role> of them (default: planner.max_<role>, else all); the planner starts
    and stops the rest (services/router/planner_loop.py)."""
    specs = instances(cfg, role)
    planner = cfg.planner
    if planner is None:
        return specs
    n = getattr(planner, f"initial_{role}") or getattr(planner, f"max_{role}") or len(specs)
    if n > len(specs):
        raise ValueError(f"planner.initial_{role}: {n} is more than the {len(specs)} instances deployment.{role} builds")
    return specs[:n]
