"""The simulator's cluster view, kept up to date one rank at a time instead of rebuilt per arrival.

It answers exactly what rackserve.routing.view.ClusterView answers (the policies and decode
placement call only these: `ranks`, `prefill_ranks()`, `prefill_rank()`, `prefill_by_key`,
`prefill_by_load()`, `decode_ranks()`, `least_loaded_decode()`), in the same orders: prefill ranks
per layout sorted by RankState.load_order, and the least-loaded decode rank by (active blocks,
running sequences, view order). A rank's change costs O(log ranks) (two bisections) where the
frozen view costs a pass over every rank and a sort. All ranks start healthy; `set_healthy` takes a
whole instance out of routing (a planner's starting, draining or stopped instance) or puts it back:
an unhealthy rank keeps its state (its running work is still counted) but no lookup returns it.
"""

from __future__ import annotations

from bisect import bisect_left

from rackserve.routing.view import RankId, RankState, prefill_instances


class LiveClusterView:
    def __init__(self, ranks: list[RankState]) -> None:
        assert all(r.healthy for r in ranks)
        self._states: dict[RankId, RankState] = {r.key: r for r in ranks}
        self._pos = {r.key: i for i, r in enumerate(ranks)}  # view order
        self.prefill_by_key: dict[RankId, RankState] = {r.key: r for r in ranks if r.role == "prefill"}  # view order
        # per layout, parallel sorted lists: the sort keys and the ranks
        self._by_load: dict[str, tuple[list[tuple], list[RankState]]] = {}
        self._decode: dict[str | None, tuple[list[tuple[int, int, int]], list[RankState]]] = {}
        for r in ranks:
            self._insert(r)
        self._ranks: tuple[RankState, ...] | None = None
        self._prefill: tuple[RankState, ...] | None = None
        self._loads: dict[str, tuple[RankState, ...]] | None = None
        self._instances: dict[str, tuple[RankState, ...]] | None = None
        self._inst_at: dict[RankId, tuple[str, int]] = {}  # a prefill rank's instance and place in it

    def state(self, key: RankId) -> RankState:
        return self._states[key]

    def replace(self, new: RankState) -> None:
        """Rank `new.key` now reads `new` (its health unchanged: set_healthy changes that)."""
        old = self._states[new.key]
        assert new.healthy == old.healthy
        self._states[new.key] = new
        self._ranks = None
        if not new.healthy:
            return  # in no lookup
        self._remove(old)
        self._insert(new)
        if new.role == "prefill":
            self.prefill_by_key[new.key] = new
            self._prefill = self._loads = None
            if self._instances is not None:  # the rank's place in its instance's tuple: replaced there
                inst, at = self._inst_at[new.key]
                ranks = self._instances[inst]
                self._instances[inst] = (*ranks[:at], new, *ranks[at + 1:])

    def set_healthy(self, instance: str, healthy: bool) -> None:
        """Every rank of `instance` routable (healthy) or not; the derived lookups are rebuilt."""
        for key, old in list(self._states.items()):
            if key[0] != instance or old.healthy == healthy:
                continue
            new = RankState(old.instance, old.dp_rank, old.layout, old.role, old.queued_tokens, old.queued_work_s,
                            old.active_decode_blocks, old.running_seqs, healthy)
            if old.healthy:
                self._remove(old)
            self._states[key] = new
            if healthy:
                self._insert(new)
        self.prefill_by_key = {k: r for k, r in self._states.items() if r.role == "prefill" and r.healthy}
        self._ranks = self._prefill = self._loads = self._instances = None
        self._inst_at = {}

    def _decode_key(self, r: RankState) -> tuple[int, int, int]:
        return (r.active_decode_blocks, r.running_seqs, self._pos[r.key])

    def _insert(self, r: RankState) -> None:
        if r.role == "prefill":
            _insert(self._by_load.setdefault(r.layout, ([], [])), r.load_order, r)
        else:
            k = self._decode_key(r)
            for layout in (None, r.layout):
                _insert(self._decode.setdefault(layout, ([], [])), k, r)

    def _remove(self, r: RankState) -> None:
        if r.role == "prefill":
            _remove(self._by_load[r.layout], r.load_order)  # load orders are unique (they end in the key)
        else:
            k = self._decode_key(r)
            for layout in (None, r.layout):
                _remove(self._decode[layout], k)

    # ---- the ClusterView interface --------------------------------------------------------------
    @property
    def ranks(self) -> tuple[RankState, ...]:
        if self._ranks is None:
            self._ranks = tuple(self._states.values())
        return self._ranks

    def prefill_ranks(self) -> tuple[RankState, ...]:
        if self._prefill is None:  # prefill_by_key keeps the view order (replace() keeps its keys)
            self._prefill = tuple(self.prefill_by_key.values())
        return self._prefill

    def prefill_rank(self, key: RankId) -> RankState | None:
        return self.prefill_by_key.get(key)

    def prefill_instances(self) -> dict[str, tuple[RankState, ...]]:
        """Built once (the simulator's ranks are all healthy: its prefill ranks, grouped), then kept
        up to date by `replace` (a rank keeps its instance and its place in it)."""
        if self._instances is None:
            self._instances = prefill_instances(self.prefill_ranks())
            self._inst_at = {r.key: (inst, i) for inst, ranks in self._instances.items() for i, r in enumerate(ranks)}
        return self._instances

    def prefill_by_load(self) -> dict[str, tuple[RankState, ...]]:
        if self._loads is None:
            # layouts in the order of their least-loaded rank, as ClusterView builds them
            ordered = sorted((lists for lists in self._by_load.values() if lists[0]), key=lambda lists: lists[0][0])
            self._loads = {ranks[0].layout: tuple(ranks) for _, ranks in ordered}
        return self._loads

    def decode_ranks(self, layout: str | None = None) -> tuple[RankState, ...]:
        return tuple(r for r in self.ranks if r.role == "decode" and r.healthy and (layout is None or r.layout == layout))

    def least_loaded_decode(self, layout: str | None = None) -> RankState | None:
        lists = self._decode.get(layout)
        return lists[1][0] if lists and lists[1] else None


def _insert(lists: tuple[list, list[RankState]], key: tuple, rank: RankState) -> None:
    keys, ranks = lists
    i = bisect_left(keys, key)
    keys.insert(i, key)
    ranks.insert(i, rank)


def _remove(lists: tuple[list, list[RankState]], key: tuple) -> None:
    keys, ranks = lists
    i = bisect_left(keys, key)
    del keys[i], ranks[i]
