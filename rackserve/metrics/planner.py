"""Planner metrics (issue 52): instances planned vs running per role, GPUs held, decisions, SLA."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

STATES = ("planned", "running", "starting", "active", "draining")


class PlannerMetrics:
    """What the live planner decided and what runs (services/router/planner_loop.py)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.instances = Gauge(
            "rackserve_planner_instances",
            "Instances per role: planned (active + starting, the planner's target), running (rank "
            "actors up on the worker), starting (start-up delay not over), active (routable), draining",
            ["role", "state"],
            registry=r,
        )
        self.gpus_held = Gauge(
            "rackserve_planner_gpus_held",
            "GPUs held by instances from the start of their start-up to the end of their drain",
            registry=r,
        )
        self.decisions = Counter(
            "rackserve_planner_decisions",
            "Planner ticks (decisions made)",
            ["policy"],
            registry=r,
        )
        self.changes = Counter(
            "rackserve_planner_changes",
            "Instance state changes the planner made, by role and new state",
            ["role", "to"],
            registry=r,
        )
        self.sla_requests = Counter(
            "rackserve_planner_sla_requests",
            "Finished requests by whether they met the planner's TTFT and ITL targets",
            ["met"],
            registry=r,
        )
