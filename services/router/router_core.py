"""The router's state and decisions: per-rank load it tracks itself, the KV index, the policy.

Load is accounted here as Dynamo's router does, and as the simulator books it: a request's work
is booked on its prefill and decode ranks at the routing decision, under the same lock, so a burst
of concurrent requests sees each other's load; the prefill part is released when the prefill rank
answers, the decode part when the stream ends. No polling is needed. The prefill rank is chosen by
the configured policy through rackserve.routing.Router (the same code the simulator runs), which
also places the decode rank (fewest active KV blocks).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace

from rackserve.kv.events import KVEvent
from rackserve.metrics import ProcessMetrics, RankKey
from rackserve.routing.cost import CostModel
from rackserve.routing.match import PrefixMatch
from rackserve.routing.regret import regret_s
from rackserve.routing.router import Router
from rackserve.routing.view import ClusterView, NoRankAvailable, PrefixHit, RankState, RequestView
from services.topology import InstanceSpec


@dataclass(frozen=True)
class Booking:
    """The load a routing decision books on its ranks until the request is done with them."""

    queued_tokens: int  # uncached prompt tokens on the prefill rank
    queued_work_s: float  # their prefill work (from the cost model)
    decode_blocks: int  # KV blocks of prompt + max_tokens on the decode rank


@dataclass(frozen=True)
class Route:
    request_id: str
    prefill_instance: str
    prefill_rank: int
    decode_instance: str
    decode_rank: int
    predicted_hit_tokens: int
    policy: str
    booking: Booking = Booking(0, 0.0, 0)
    # what the decision saw, for its regret once the prefill rank says what it delivered
    seen: tuple[RequestView, tuple[RankState, ...], PrefixMatch, PrefixHit] | None = field(
        default=None, compare=False, repr=False)


PARTS = ("prefill", "decode")


class RouterCore:
    """Thread-safe: the HTTP front door and the gRPC Route service share one."""

    def __init__(
        self,
        prefill: list[InstanceSpec],
        decode: list[InstanceSpec],
        router: Router,
        block_size: int,
        metrics: ProcessMetrics,
        cost: CostModel | None = None,
    ) -> None:
        self.router = router
        self.metrics = metrics
        self.block_size = block_size
        self.cost = cost
        self._lock = threading.Lock()
        self._down: dict[tuple[str, int], set[str]] = {}  # why a rank is out of routing
        self._ranks: dict[tuple[str, int], RankState] = {}
        self._held: dict[str, tuple[Route, set[str]]] = {}  # request id -> its booked parts
        metrics.router.regret.labels(policy=router.policy.name)  # exported at 0 from the start
        for spec in [*prefill, *decode]:
            for r in range(spec.dp_ranks):
                self._ranks[(spec.name, r)] = RankState(spec.name, r, spec.layout, spec.role)

    @property
    def policy_name(self) -> str:
        return self.router.policy.name

    def snapshot(self) -> ClusterView:
        with self._lock:
            return ClusterView(tuple(self._ranks.values()))

    def route(self, request_id: str, prompt: list[int], hashes: list[int], max_tokens: int = 0) -> Route:
        """Decide where `request_id` runs and book its load there at once (see `release`); a
        request id routed again keeps only its newest booking."""
        request = RequestView(tuple(hashes), len(prompt), self.block_size, request_id)
        started = time.perf_counter()
        with self._lock:  # the index is fed from the KV-event thread
            self._release_locked(request_id, PARTS)
            view = ClusterView(tuple(self._ranks.values()))
            decision = self.router.route(request, view)
            if decision.decode_instance is None or decision.decode_dp_rank is None:
                raise NoRankAvailable("cluster: no decode rank", "decode")
            route = Route(
                request_id,
                decision.instance,
                decision.dp_rank,
                decision.decode_instance,
                decision.decode_dp_rank,
                decision.predicted.total,
                decision.policy,
                seen=(request, view.prefill_ranks(), decision.match, decision.predicted),
            )
            route = replace(route, booking=self._booking(route, len(prompt), max_tokens))
            self._book_locked(route)
        m = self.metrics.router
        m.decision_latency.labels(policy=decision.policy).observe(time.perf_counter() - started)
        rank = RankKey(decision.instance, decision.dp_rank, "prefill")
        m.decisions.labels(policy=decision.policy, **rank.labels()).inc()
        return route

    def _booking(self, route: Route, prompt_tokens: int, max_tokens: int) -> Booking:
        queued = max(0, prompt_tokens - route.predicted_hit_tokens)
        work = self._work_s((route.prefill_instance, route.prefill_rank), queued, route.predicted_hit_tokens)
        return Booking(queued, work, -(-(prompt_tokens + max_tokens) // self.block_size))

    def _book_locked(self, route: Route) -> None:
        b = route.booking
        self._adjust_locked((route.prefill_instance, route.prefill_rank), queued_tokens=b.queued_tokens,
                            queued_work_s=b.queued_work_s, running_seqs=1)
        self._adjust_locked((route.decode_instance, route.decode_rank), running_seqs=1,
                            active_decode_blocks=b.decode_blocks)
        self._held[route.request_id] = (route, set(PARTS))

    def release(self, route: Route, parts: tuple[str, ...] = PARTS) -> None:
        """The request is done with its prefill rank ("prefill"), its decode rank ("decode") or
        both: their booked load goes. Idempotent; a newer booking of the same id is left alone."""
        with self._lock:
            held = self._held.get(route.request_id)
            if held is not None and held[0] is route:
                self._release_locked(route.request_id, parts)

    def release_id(self, request_id: str) -> bool:
        """Release whatever `request_id` holds (the gRPC Release call). False if it held nothing."""
        with self._lock:
            return self._release_locked(request_id, PARTS)

    def _release_locked(self, request_id: str, parts: tuple[str, ...]) -> bool:
        held = self._held.get(request_id)
        if held is None:
            return False
        route, left = held
        b = route.booking
        if "prefill" in parts and "prefill" in left:
            self._adjust_locked((route.prefill_instance, route.prefill_rank), queued_tokens=-b.queued_tokens,
                                queued_work_s=-b.queued_work_s, running_seqs=-1)
        if "decode" in parts and "decode" in left:
            self._adjust_locked((route.decode_instance, route.decode_rank), running_seqs=-1,
                                active_decode_blocks=-b.decode_blocks)
        left.difference_update(parts)
        if not left:
            del self._held[request_id]
        return True

    def apply_events(self, events: list[KVEvent], new_gaps: int = 0) -> None:
        with self._lock:
            self.router.index.apply_all(events)
            blocks, stale = len(self.router.index), len(self.router.index.stale_publishers())
        m = self.metrics.router
        for event in events:
            m.events.labels(kind=event.kind).inc()
        m.event_gaps.inc(new_gaps)
        m.index_blocks.set(blocks)
        m.stale_publishers.set(stale)

    def record_delivery(self, route: Route, delivered_hit_tokens: int) -> None:
        """Predicted (at routing) vs delivered (by the prefill rank) cached tokens."""
        rank = RankKey(route.prefill_instance, route.prefill_rank, "prefill")
        self.metrics.cache.record_decision_outcome(
            rank, route.predicted_hit_tokens, delivered_hit_tokens
        )
        regret = self.regret_s(route, delivered_hit_tokens)
        if regret is not None:
            self.metrics.router.regret.labels(policy=route.policy).observe(regret)

    def regret_s(self, route: Route, delivered_hit_tokens: int) -> float | None:
        """The decision's regret (rackserve/routing/regret.py) with the chosen rank's delivered
        hit: the ranks as the decision saw them (queued work, prefix index), the chosen one priced
        with what it really found. Delivered tokens fill the predicted tiers in order (rank HBM,
        pool HBM, then DRAM). None without a cost model."""
        if route.seen is None or self.cost is None:
            return None
        request, ranks, match, predicted = route.seen
        rank = min(delivered_hit_tokens, predicted.rank_hbm)
        pool_hbm = min(delivered_hit_tokens - rank, predicted.pool_hbm)
        hit = PrefixHit(rank, pool_hbm, delivered_hit_tokens - rank - pool_hbm)
        chosen = (route.prefill_instance, route.prefill_rank)
        return regret_s(self.cost, request, ranks, match, chosen, hit)

    def mark_health(self, instance: str, rank: int, healthy: bool, reason: str = "failed") -> None:
        """Take a rank out of routing (False) or back in (True) for `reason` ("failed": see
        services/router/migration.py; "probe": the health probe); it is routed to when no reason
        holds it out."""
        key = (instance, rank)
        with self._lock:
            reasons = self._down.setdefault(key, set())
            if healthy:
                reasons.discard(reason)
            else:
                reasons.add(reason)
            self._ranks[key] = replace(self._ranks[key], healthy=not reasons)

    def apply_probe(self, instances: list[str], unresponsive: set[str]) -> None:
        """A worker's Health reply: its ranks listed in `unresponsive` are out, the rest in."""
        for name, rank in [key for key in self._ranks if key[0] in instances]:
            self.mark_health(name, rank, f"{name}/{rank}" not in unresponsive, reason="probe")

    def drain(self, instance: str, draining: bool | None) -> dict:
        """Take `instance` out of routing (True), back in (False) or neither (None); its running
        requests (prefill or decode in flight) are counted, never cut. KeyError: no such instance."""
        ranks = self.ranks_of(instance)
        if not ranks:
            raise KeyError(instance)
        for rank in ranks if draining is not None else []:
            self.mark_health(instance, rank, not draining, reason="drain")
        with self._lock:
            states = [self._ranks[(instance, r)] for r in ranks]
            held = "drain" in self._down.get((instance, ranks[0]), ())
        return {
            "instance": instance,
            "draining": held,
            "running": sum(s.running_seqs for s in states),
        }

    def rank_health(self) -> list[dict]:
        """Every rank's routing health and the reasons holding it out (for /admin/ranks)."""
        with self._lock:
            return [
                {
                    "instance": s.instance,
                    "rank": s.dp_rank,
                    "role": s.role,
                    "healthy": s.healthy,
                    "down": sorted(self._down.get((s.instance, s.dp_rank), ())),
                }
                for s in self._ranks.values()
            ]

    def routable(self, role: str) -> bool:
        """Some rank of `role` is in routing (answering its probe, not quarantined, not drained)."""
        with self._lock:
            return any(s.healthy for s in self._ranks.values() if s.role == role)

    def rank_states(self, instance: str) -> list[RankState]:
        """The load routing books on each DP rank of `instance` now (the planner's metric pull)."""
        with self._lock:
            return [s for (name, _), s in self._ranks.items() if name == instance]

    def ranks_of(self, instance: str) -> list[int]:
        """The DP ranks of `instance` known to routing."""
        return sorted(rank for name, rank in self._ranks if name == instance)

    def _adjust_locked(self, key: tuple[str, int], **delta: float) -> None:
        state = self._ranks[key]
        changes = {name: getattr(state, name) + d for name, d in delta.items()}
        self._ranks[key] = replace(state, **changes)

    def _work_s(self, key: tuple[str, int], uncached: int, cached: int) -> float:
        if self.cost is None:
            return 0.0
        return self.cost.prefill_estimate_s(self._ranks[key].layout, uncached, cached)
