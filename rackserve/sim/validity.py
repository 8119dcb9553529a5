"""AgentX's validity checks of a run (REFERENCE.md "How the benchmark measures"; data/agentx README):
a run is invalid when more than 1% of its requests overflow the model's context, or when metric
coverage falls under 95%: here, of the requests the measured window saw end or still hold (finished,
rejected, in flight at its end), the share that finished with their metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

from rackserve.workload.trace_replay import MAX_OVERFLOW_SHARE

MIN_METRIC_COVERAGE = 0.95  # AgentX: a run is invalid under 95% metric coverage


@dataclass(frozen=True)
class Validity:
    overflow_share: float
    metric_coverage: float

    @property
    def reasons(self) -> list[str]:
        out = []
        if self.overflow_share > MAX_OVERFLOW_SHARE:
            out.append(f"{self.overflow_share:.1%} of requests overflow the context (AgentX: at most "
                       f"{MAX_OVERFLOW_SHARE:.0%})")
        if self.metric_coverage < MIN_METRIC_COVERAGE:
            out.append(f"metric coverage {self.metric_coverage:.1%} (AgentX: at least {MIN_METRIC_COVERAGE:.0%}): "
                       "requests rejected or still in flight at the window's end")
        return out

    @property
    def valid(self) -> bool:
        return not self.reasons


def run_validity(source: object, completed: int, rejected: int, in_flight: int) -> Validity:
    """`source`: the run's arrival source (a conversation replay reports its overflows)."""
    stats = getattr(source, "stats", None)
    overflow = stats().overflow_share if callable(stats) else 0.0
    seen = completed + rejected + in_flight
    return Validity(overflow, completed / seen if seen else 1.0)


def coverage_at_window(completed: int, rejected: int, coverage: float, window_s: float, nominal_s: float) -> float:
    """Metric coverage a run measured over `window_s` would show over the benchmark's `nominal_s`
    window in the same steady state: finished and rejected requests grow with the window, the
    requests in flight at its end do not (a closed loop holds at most one per lane). A search that
    cuts a dear point's window (rackserve.search.plan) judges validity on this, not on the cut
    window's own coverage, which a 120 s cut drags under 95% wherever E2E is tens of seconds."""
    if coverage <= 0 or window_s <= 0 or nominal_s <= window_s:
        return coverage
    in_flight = max(completed / coverage - completed - rejected, 0.0)
    k = nominal_s / window_s
    seen = k * (completed + rejected) + in_flight
    return k * completed / seen if seen else coverage
