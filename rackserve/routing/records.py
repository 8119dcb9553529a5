"""Decision records: what the router predicted would be cached, and what the rank then delivered."""

from __future__ import annotations

from dataclasses import dataclass

from rackserve.routing.view import Decision


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    request_id: str
    decision: Decision
    prompt_tokens: int
    delivered_cached_tokens: int | None = None  # None until the rank reports it


@dataclass(frozen=True, slots=True)
class HitRateStats:
    """Totals over delivered decisions (undelivered ones are counted in `pending` only)."""

    decisions: int
    pending: int
    prompt_tokens: int
    predicted_tokens: int
    delivered_tokens: int
    overpredicted_decisions: int  # delivered fewer cached tokens than predicted

    @property
    def predicted_hit_rate(self) -> float:
        return self.predicted_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def delivered_hit_rate(self) -> float:
        return self.delivered_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class DecisionRecorder:
    """Keeps one record per request id (the latest decision); `deliver` completes it once the
    prefill rank reports how many prompt tokens it really found cached."""

    def __init__(self) -> None:
        self._records: dict[str, DecisionRecord] = {}

    def record(self, request_id: str, decision: Decision, prompt_tokens: int) -> None:
        """Record (or, for a re-routed request, replace) the decision for `request_id`."""
        self._records[request_id] = DecisionRecord(request_id, decision, prompt_tokens)

    def deliver(self, request_id: str, cached_tokens: int) -> DecisionRecord:
        rec = self._records.get(request_id)
        if rec is None:
            raise ValueError(f"request_id {request_id!r} has no recorded decision")
        if cached_tokens < 0 or cached_tokens > rec.prompt_tokens:
            raise ValueError(
                f"cached_tokens must be in [0, {rec.prompt_tokens}], got {cached_tokens}"
            )
        done = DecisionRecord(rec.request_id, rec.decision, rec.prompt_tokens, cached_tokens)
        self._records[request_id] = done
        return done

    def get(self, request_id: str) -> DecisionRecord | None:
        return self._records.get(request_id)

    def __len__(self) -> int:
        return len(self._records)

    def stats(self) -> HitRateStats:
        done = [r for r in self._records.values() if r.delivered_cached_tokens is not None]
        return HitRateStats(
            decisions=len(self._records),
            pending=len(self._records) - len(done),
            prompt_tokens=sum(r.prompt_tokens for r in done),
            predicted_tokens=sum(r.decision.predicted.total for r in done),
            delivered_tokens=sum(r.delivered_cached_tokens or 0 for r in done),
            overpredicted_decisions=sum(
                1 for r in done if (r.delivered_cached_tokens or 0) < r.decision.predicted.total
            ),
        )
