"""Kernel optimization switches of the Rubin deployment, and the presets that bundle them.

Each switch changes the cost through its mechanism inside step_cost.py (never a fixed percentage):
  domain-local      MoE weights, LM head, combine buffer, mHC residual and KV stay in the reading
                    die's memory domain (no remote-domain reads).
  megamoe-tiles     MegaMoE: fused grouped GEMM whose tiles are sized by the busiest EP rank's tokens
                    per expert (less padding than fixed 128-row tiles; the SwiGLU intermediate stays
                    on chip instead of a round trip through HBM between two GEMMs).
  megagate          MegaGate: exact sqrt-softplus only for experts that can still enter the top-k.
  fp8xfp4-k64       SM107 K64 FP8xFP4 MMA: routed experts run at the FP4 rate instead of FP8.
  fp4-indexer       K128 FP4 MMA in the sparse-attention indexer (FP4 rate instead of FP8).
  attn-overlap      MegaAttn: tensor cores do not wait on loads (max(load, math), not partly summed).
  split-k           decode GEMMs split K across the cluster so every SM streams weights (the
                    baseline is a library split-K heuristic, as calibrated on the H200).
  sentinel-combine  combine waits on a sentinel instead of a barrier (one NVLink latency less).
  tp8-packed-fp4    TP8: packed FP4 weight stages, 11 pipeline stages instead of 7 (more bytes in flight).
  shared-in-routed  shared expert packed into the routed GEMM below 16 rows (one kernel less).
  fused-ar-mhc      TP8: all-reduce and mHC residual update fused in one pass.
  kv-gather-ahead   sparse-MLA KV gathered ahead of use (gather latency hidden).
  pdl               kernels replayed from a CUDA graph with programmatic dependent launch: a smaller
                    launch gap, and each kernel's prologue runs under its predecessor's tail.
  oneshot-allreduce small TP all-reduces as one NVLink one-shot (each rank stores its partial into
                    every peer) instead of a ring, where that is faster.
  mtp               speculative decoding by the model's draft layers (speculative.py); off = one token
                    per sequence per step.
  two-batch-overlap two micro-batches, one's EP dispatch/combine under the other's GEMMs (vLLM's dual
                    batch overlap, which targets DP+EP deployments: docs.vllm.ai design/dbo); only
                    where it pays (overlap.py).

A switch may need hardware (REQUIRES): on hardware without it the switch is skipped (applicable()),
so presets apply only what the hardware supports and `rackserve timing` lists what was skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

from rackserve.timing.spec import HardwareSpec

SWITCHES = (
    "domain-local",
    "megamoe-tiles",
    "megagate",
    "fp8xfp4-k64",
    "fp4-indexer",
    "attn-overlap",
    "split-k",
    "sentinel-combine",
    "tp8-packed-fp4",
    "shared-in-routed",
    "fused-ar-mhc",
    "kv-gather-ahead",
    "pdl",
    "oneshot-allreduce",
    "mtp",
    "two-batch-overlap",
)
# Serving features vLLM runs regardless of the kernel generation: on in both presets.
SERVING_DEFAULTS = ("mtp", "two-batch-overlap")

# What each hardware-bound switch needs, and how to tell from the hardware spec.
FEATURES: dict[str, Callable[[HardwareSpec], bool]] = {
    "sm107_mma": lambda hw: "sm107_mma" in hw.features,  # REFERENCE: SM107 block-scaled MMA
    "fp4_mma": lambda hw: hw.peak_flops.fp4 is not None,  # FP4 tensor cores (packed FP4 weights)
    "two_memory_domains": lambda hw: hw.memory_domains > 1,  # REFERENCE: two dies per GPU
    "nvlink_tp8": lambda hw: hw.nvlink_domain_gpus >= 8,  # TP8 peers reachable by NVLink stores
}
REQUIRES: dict[str, str] = {
    "fp8xfp4-k64": "sm107_mma",  # REFERENCE: K64 FP8xFP4 is an SM107 MMA
    "fp4-indexer": "sm107_mma",  # REFERENCE: K128 FP4 MMA (SM107) in the indexer
    "domain-local": "two_memory_domains",
    "tp8-packed-fp4": "fp4_mma",
    "fused-ar-mhc": "nvlink_tp8",
    "oneshot-allreduce": "nvlink_tp8",
}


@dataclass(frozen=True)
class Optimizations:
    domain_local: bool = False
    megamoe_tiles: bool = False
    megagate: bool = False
    fp8xfp4_k64: bool = False
    fp4_indexer: bool = False
    attn_overlap: bool = False
    split_k: bool = False
    sentinel_combine: bool = False
    tp8_packed_fp4: bool = False
    shared_in_routed: bool = False
    fused_ar_mhc: bool = False
    kv_gather_ahead: bool = False
    pdl: bool = False
    oneshot_allreduce: bool = False
    mtp: bool = False
    two_batch_overlap: bool = False

    def enabled(self) -> list[str]:
        return [f.name.replace("_", "-") for f in fields(self) if getattr(self, f.name)]

    def with_switch(self, name: str, on: bool = True) -> Optimizations:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values[_attr(name)] = on
        return Optimizations(**values)

    def applicable(self, hw: HardwareSpec) -> tuple[Optimizations, dict[str, str]]:
        """(the switches this hardware supports, {skipped switch: why})."""
        opts, skipped = self, {}
        for name in self.enabled():
            need = REQUIRES.get(name)
            if need and not FEATURES[need](hw):
                opts = opts.with_switch(name, False)
                skipped[name] = f"{hw.name} lacks {need}"
        return opts, skipped


PRESETS: dict[str, Optimizations] = {
    "baseline": Optimizations(
        **{_n.replace("-", "_"): True for _n in SERVING_DEFAULTS}
    ),  # GB300-era kernels
    "rubin-optimized": Optimizations(**{_n.replace("-", "_"): True for _n in SWITCHES}),
    # every switch, each kept only where the hardware can run it (applicable()): a rack compared at the
    # best software its hardware supports. On GB300 (SM100, two dies) that is all but the two SM107 MMA
    # switches: REFERENCE.md, "the engine forms and DeepSeek's kernel set ran on GB300 before being
    # rewritten for SM107". `baseline` stays the explicit "no kernel optimizations" preset.
    "best": Optimizations(**{_n.replace("-", "_"): True for _n in SWITCHES}),
}


def _attr(name: str) -> str:
    if name not in SWITCHES:
        raise ValueError(f"optimizations: unknown switch {name!r} (known: {', '.join(SWITCHES)})")
    return name.replace("-", "_")


def parse_optimizations(text: str) -> Optimizations:
    """'baseline' | 'rubin-optimized' | 'switch,switch' | 'baseline,+switch' | 'rubin-optimized,-switch'."""
    opts = Optimizations()
    for item in (part.strip() for part in text.split(",")):
        if not item or item == "none":
            continue
        if item in PRESETS:
            opts = PRESETS[item]
        elif item[0] in "+-":
            opts = opts.with_switch(item[1:], item[0] == "+")
        else:
            opts = opts.with_switch(item, True)
    return opts
