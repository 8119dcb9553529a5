"""The router's cost model backed by rackserve.timing.TimingModel, fast enough to call per decision.

A direct TimingModel.prefill_estimate_s costs milliseconds (a full step-cost evaluation); the
router needs it for several ranks within microseconds. So each layout's prefill time is
tabulated once, on first use, over a grid of (new tokens, cached tokens) and interpolated
bilinearly (exact for the a + b*new + c*cached + d*new*cached part of attention; the grid is
dense enough in new tokens that the new^2 part stays within a few percent - see the test).
KV transfer times are memoised per (tokens, tier).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rackserve.config import Config
from rackserve.timing import Layout, TimingModel
from rackserve.timing.layout import parse_layout_key

# New-token grid: 1, then 16 * sqrt(2)^k up to 256k tokens (half-octave steps).
NEW_GRID: tuple[int, ...] = (1, *sorted({round(16 * 2 ** (k / 2)) for k in range(29)}))
CACHED_GRID: tuple[int, ...] = (0, 1024, 4096, 16384, 65536, 262144, 1048576)


class PrefillTable:
    """Prefill seconds of one layout on the grid, interpolated in between (extrapolated past it)."""

    def __init__(
        self,
        model: TimingModel,
        layout: Layout,
        new_grid: Sequence[int] = NEW_GRID,
        cached_grid: Sequence[int] = CACHED_GRID,
    ) -> None:
        self.new_grid = tuple(new_grid)
        self.cached_grid = tuple(cached_grid)
        self.table = [
            [model.prefill_estimate_s(layout, n, c) for c in self.cached_grid]
            for n in self.new_grid
        ]

    def __call__(self, new_tokens: int, cached_tokens: int) -> float:
        if new_tokens <= 0:
            return 0.0
        new_grid, cached_grid = self.new_grid, self.cached_grid
        i = bisect.bisect_right(new_grid, new_tokens, 0, len(new_grid) - 1) - 1
        j = bisect.bisect_right(cached_grid, cached_tokens, 0, len(cached_grid) - 1) - 1
        i, j = i if i > 0 else 0, j if j > 0 else 0  # below the grid: extrapolate the first cell
        tx = (new_tokens - new_grid[i]) / (new_grid[i + 1] - new_grid[i])
        ty = (cached_tokens - cached_grid[j]) / (cached_grid[j + 1] - cached_grid[j])
        t0, t1 = self.table[i], self.table[i + 1]
        low = t0[j] + (t0[j + 1] - t0[j]) * ty
        high = t1[j] + (t1[j + 1] - t1[j]) * ty
        return low + (high - low) * tx


@dataclass(frozen=True)
class LayoutKey:
    """Which priced layout: a prefill and a decode group of one layout name may differ in ranks
    (a 4-rank wide-ep prefill is not the 16-rank wide-ep decode), so the name alone is not a key."""

    phase: str  # "prefill" | "decode"
    layout: str  # rackserve.config.InstanceGroup.layout
    ranks: int


class TimingCost:
    """rackserve.routing.CostModel over a TimingModel. `prefill_estimate_s` takes the layout as
    RankState.layout names it: a prefill group's layout name ("dep2", "wide-ep", "tp8"), or a
    Layout.key such as "wide-ep16"."""

    def __init__(self, model: TimingModel, layouts: Mapping[LayoutKey | str, Layout] | None = None) -> None:
        self.model = model
        self._layouts = {  # a bare name (the simulator's) is a prefill layout of that name
            (k if isinstance(k, LayoutKey) else LayoutKey("prefill", k, getattr(v, "gpus", 0))): v
            for k, v in (layouts or {}).items()
        }
        self._tables: dict[str, PrefillTable] = {}
        self._transfer: dict[tuple[int, str], float] = {}

    @classmethod
    def from_config(cls, config: Config, model: TimingModel | None = None) -> TimingCost:
        """Cost of the config's deployment: its layouts by (phase, name, ranks) on its timing model."""
        tm = model or TimingModel.from_section(config.timing)
        groups = [("prefill", g) for g in config.deployment.prefill]
        groups += [("decode", g) for g in config.deployment.decode]
        return cls(tm, {LayoutKey(phase, g.layout, g.ranks): tm.layout(g.layout, g.ranks, g.moe_tp) for phase, g in groups})

    def prefill_estimate_s(self, layout: str, new_tokens: int, cached_tokens: int) -> float:
        table = self._tables.get(layout)
        if table is None:
            table = self._tables[layout] = PrefillTable(self.model, self.layout_of(layout))
        return table(new_tokens, cached_tokens)

    def kv_transfer_s(self, tokens: int, tier: str) -> float:
        key = (tokens, tier)
        seconds = self._transfer.get(key)
        if seconds is None:
            seconds = self._transfer[key] = self.model.kv_transfer_s(tokens, tier)
        return seconds

    def layout_of(self, name: str, phase: str = "prefill") -> Layout:
        """The Layout of `phase` a RankState.layout name stands for. ValueError when two groups
        of that phase share the name with different ranks (name them by Layout.key then)."""
        found = {getattr(v, "key", k.layout): v for k, v in self._layouts.items()
                 if k.phase == phase and name in (k.layout, getattr(v, "key", k.layout))}
        if len(found) > 1:
            raise ValueError(f"layout {name!r}: {phase} groups of {sorted(found)}; name one by its key")
        if found:
            return next(iter(found.values()))
        lay = parse_layout_key(name)
        return self.model.layout(lay.name, None if lay.name in ("dep2", "tp8") else lay.gpus, lay.moe_tp or 1)
