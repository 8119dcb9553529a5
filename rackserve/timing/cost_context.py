"""What the step cost needs that does not change between steps: specs, switches, the layer groups
of each phase (all tokens / prefill tail) and their per-attention-code layer counts."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rackserve.timing.batch_features import CodeShape, code_shapes
from rackserve.timing.engram_placement import HBM_SHARDED, check_placement
from rackserve.timing.launch_path import on_launch_path
from rackserve.timing.optimizations import Optimizations
from rackserve.timing.spec import HardwareSpec, ModelSpec

MEMO_LIMIT = 50_000


@dataclass(frozen=True)
class LayerGroups:
    """Layer counts of one phase's two layer groups (all tokens / prefill tail), per attention code."""

    code_counts: tuple[np.ndarray, np.ndarray]
    indexer_layers: tuple[int, int]
    moe_layers: tuple[int, int]
    dense_layers: tuple[int, int]
    layers: tuple[int, int]
    engram: tuple[tuple[int, int], ...] = field(default=())  # (group, layer index)


@dataclass(frozen=True)
class CostContext:
    """Everything that does not change between steps: specs, switches, derived constants."""

    hw: HardwareSpec
    model: ModelSpec
    opts: Optimizations
    codes: tuple[CodeShape, ...]
    groups: dict[str, LayerGroups]
    indexer_codes: np.ndarray  # 1.0 for attention codes that use the indexer
    memo: dict = field(default_factory=dict, compare=False, repr=False)  # see _token_bundle
    engram_placement: str = HBM_SHARDED  # rackserve/timing/engram_placement.py

    @staticmethod
    def build(hw: HardwareSpec, model: ModelSpec, opts: Optimizations,
              engram_placement: str = HBM_SHARDED) -> CostContext:
        hw = on_launch_path(hw, opts.pdl)
        codes = code_shapes(model)
        order = sorted(model.attention.codes)
        groups = {p: _layer_groups(model, order, p) for p in ("prefill", "decode")}
        indexer = np.array([float(c.indexer) for c in codes])
        return CostContext(hw, model, opts, codes, groups, indexer,
                           engram_placement=check_placement(engram_placement))


def _layer_groups(model: ModelSpec, order: list[int], phase: str) -> LayerGroups:
    split = model.layers if phase == "decode" else model.prefill.full_layers
    spans = (range(0, split), range(split, model.layers))
    counts = tuple(
        np.array([sum(model.attention.layer_codes[i] == c for i in s) for c in order], float)
        for s in spans
    )
    idx = tuple(
        sum(model.attention.codes[model.attention.layer_codes[i]].indexer for i in s) for s in spans
    )
    moe = tuple(sum(i >= model.moe.first_dense_layers for i in s) for s in spans)
    dense = tuple(len(s) - m for s, m in zip(spans, moe, strict=False))
    engram = tuple(
        (0 if i < split else 1, i) for i in (model.engram.layers if model.engram else [])
    )
    return LayerGroups(counts, idx, moe, dense, (len(spans[0]), len(spans[1])), engram)  # type: ignore[arg-type]
