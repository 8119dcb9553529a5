"""The routing decision both the simulator and the live router call: index + policy + decode placement."""

from __future__ import annotations

from rackserve.config import RoutingSection
from rackserve.routing.cost import CostModel
from rackserve.routing.decode import place_decode
from rackserve.routing.index import PrefixIndex
from rackserve.routing.match import PrefixMatch
from rackserve.routing.policy import Policy, PolicySettings, make_policy
from rackserve.routing.records import DecisionRecorder
from rackserve.routing.view import ClusterView, Decision, NoRankAvailable, RequestView


def policy_settings(section: RoutingSection, cost: CostModel | None = None) -> PolicySettings:
    """The policy knobs of a routing section (overlap_score_weight only when the config names it:
    it is Dynamo's deprecated alias of prefill_load_scale)."""
    legacy = section.overlap_score_weight if "overlap_score_weight" in section.model_fields_set else None
    return PolicySettings(
        cost=cost,
        seed=section.seed,
        overlap_score_weight=legacy,
        prefill_load_scale=section.prefill_load_scale,
        overlap_score_credit=section.overlap_score_credit,
        pool_hbm_hit_weight=section.pool_hbm_hit_weight,
        host_cache_hit_weight=section.host_cache_hit_weight,
        temperature=section.temperature,
        lockstep_balance=section.lockstep_balance,
        prefix_hash_blocks=section.prefix_hash_blocks,
    )


class Router:
    """Owns the prefix index (feed it with `router.index.apply(event)`), one policy, and the
    decision records (`router.records.deliver(request_id, cached_tokens)` once the rank reports)."""

    def __init__(
        self,
        policy: Policy,
        index: PrefixIndex | None = None,
        records: DecisionRecorder | None = None,
    ) -> None:
        self.policy = policy
        self.index = index if index is not None else PrefixIndex()
        self.records = records if records is not None else DecisionRecorder()

    @classmethod
    def from_config(cls, section: RoutingSection, cost: CostModel | None = None) -> Router:
        return cls(make_policy(section.policy, policy_settings(section, cost)))

    def route(self, request: RequestView, cluster: ClusterView) -> Decision:
        """Pick a prefill rank (by policy) and a decode rank (least active blocks) for `request`;
        recorded under `request.request_id` when it has one."""
        if not cluster.prefill_ranks():
            raise NoRankAvailable("cluster: no healthy prefill rank", "prefill")
        match = self.match(request)
        pick = self.policy.choose(request, cluster, match)
        decode = place_decode(cluster, request.decode_layout)
        decision = Decision(
            instance=pick.rank.instance,
            dp_rank=pick.rank.dp_rank,
            predicted=match.hit(pick.rank.key),
            score=pick.score,
            policy=self.policy.name,
            decode_instance=None if decode is None else decode.instance,
            decode_dp_rank=None if decode is None else decode.dp_rank,
            match=match,
        )
        if request.request_id:
            self.records.record(request.request_id, decision, request.prompt_tokens)
        return decision

    def match(self, request: RequestView) -> PrefixMatch:
        """Index lookup for `request` (every policy's decision records predicted hits)."""
        return self.index.match(request.block_hashes, request.block_size, request.prompt_tokens)
