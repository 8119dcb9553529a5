"""Hardware and model specs: YAML data under specs/ loaded into typed, validated, frozen objects.

Every number in the YAML carries its source in a comment; load errors name the file and the field.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

SPEC_DIR = Path(__file__).parent / "specs"
Dtype = Literal["fp4", "fp8", "bf16"]

# Bytes per stored element. NVFP4 keeps one FP8 scale per 16 values: 0.5 + 1/16 = 0.53125, which is
# exactly REFERENCE's 18,800,640 B per routed expert (3 x 5120 x 2304 weights).
DTYPE_BYTES: dict[str, float] = {"fp4": 0.53125, "fp8": 1.0, "bf16": 2.0}


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PeakFlops(_Spec):
    fp4: float | None = Field(
        None, gt=0, description="dense NVFP4 FLOP/s (None: no FP4 tensor cores)"
    )
    fp8: float = Field(gt=0)
    bf16: float = Field(gt=0)
    vector_fp32: float = Field(gt=0, description="non-tensor FP32 FLOP/s")


class GemmCompute(_Spec):
    bf16: float = Field(gt=0, le=1)
    fp8: float = Field(gt=0, le=1)
    fp4: float | None = Field(None, gt=0, le=1)


class Efficiency(_Spec):
    """Achieved fractions of peak per kernel class (calibrated on the H200, public starts elsewhere)."""

    gemm_compute: GemmCompute
    grouped_compute: float = Field(gt=0, le=1)
    gemm_memory: float = Field(gt=0, le=1)
    grouped_memory: float = Field(gt=0, le=1)
    attention_memory: float = Field(gt=0, le=1)
    attention_compute: float = Field(gt=0, le=1)
    hbm: float = Field(gt=0, le=1)
    nvlink: float = Field(gt=0, le=1)
    rdma: float = Field(0.8, gt=0, le=1, description="achieved share of the NIC's RDMA bandwidth")
    attention_overlap: float = Field(ge=0, le=1)


class Microarch(_Spec):
    kernel_overhead_s: float = Field(ge=0)
    per_sm_bw_bytes_per_s: float = Field(gt=0)
    smem_stage_bytes: int = Field(gt=0)
    mem_latency_s: float = Field(ge=0)
    gather_latency_s: float = Field(ge=0)
    tile_m: int = Field(gt=0)


class Launch(_Spec):
    """Kernel launch path: replaying a CUDA graph, with or without programmatic dependent launch."""

    graph_gap_s: float = Field(ge=0, description="launch gap between graph-replayed kernels")
    pdl_gap_s: float = Field(ge=0, description="the same gap under PDL")
    pdl_prologue_s: float = Field(
        ge=0, description="fixed per-kernel work PDL overlaps with the predecessor's tail"
    )


HardwareFeature = Literal["sm107_mma", "nvl72_domain"]


class HardwareSpec(_Spec):
    """One GPU of a rack: peaks, memory domains, links, and the achieved-fraction parameters."""

    name: str
    hbm_bytes: float = Field(gt=0)
    hbm_bw_bytes_per_s: float = Field(gt=0)
    memory_domains: int = Field(ge=1, le=2)
    remote_domain_bw_factor: float = Field(gt=0, le=1)
    die_to_die_bw_bytes_per_s: float = Field(gt=0)
    sm_count: int = Field(gt=0)
    peak_flops: PeakFlops
    nvlink_bw_bytes_per_s: float = Field(gt=0, description="per GPU, each direction")
    nvlink_latency_s: float = Field(ge=0)
    allreduce_latency_s: float = Field(ge=0)
    cross_tray_latency_s: float = Field(ge=0)
    host_link_bw_bytes_per_s: float = Field(gt=0)
    host_dram_bw_bytes_per_s: float = Field(gt=0)
    kv_block_overhead_s: float = Field(ge=0, description="per KV block moved between pool and rank")
    gpus_per_tray: int = Field(4, gt=0, description="GPUs sharing one host (tray / node)")
    cpus_per_tray: int = Field(1, gt=0, description="host CPUs of a tray, each with its own DRAM and GPU links")
    host_dram_bytes_per_tray: float | None = Field(
        None, gt=0, description="host DRAM of one tray (pool tier)"
    )
    nic_rdma_bw_bytes_per_s: float | None = Field(
        None, gt=0, description="RDMA NIC per GPU, each direction"
    )
    nic_latency_s: float = Field(5.0e-6, ge=0, description="one RDMA message across the scale-out network")
    ep_straggler_s: float = Field(
        0.0, ge=0, description="per EP barrier: a rank's arrival jitter (s); the slowest of ep ranks "
        "is waited for: x sqrt(2 ln ep)")
    step_overhead_s: float = Field(
        0.0, ge=0, description="per engine step: host work not hidden under the GPU's (scheduling, "
        "sampling, launch of the step's graph)")
    features: list[HardwareFeature] = Field(default_factory=list)
    nvlink_domain_gpus: int = Field(gt=0, description="GPUs reachable by NVLink load/store")
    oneshot_allreduce_latency_s: float = Field(ge=0)
    efficiency: Efficiency
    microarch: Microarch
    launch: Launch

    def peak(self, dtype: str) -> float:
        """Tensor-core peak for a math precision; FP4 falls back to FP8 where there is no FP4 unit."""
        if dtype == "fp4":
            return self.peak_flops.fp4 or self.peak_flops.fp8
        return float(getattr(self.peak_flops, dtype))

    def gemm_eff(self, dtype: str) -> float:
        eff = self.efficiency.gemm_compute
        if dtype == "fp4":
            return eff.fp4 if self.peak_flops.fp4 and eff.fp4 else eff.fp8
        return float(getattr(eff, dtype))

    def stored_bytes(self, dtype: str) -> float:
        """Bytes per weight as stored here: FP4 weights are kept as FP8 on a GPU without FP4 units."""
        if dtype == "fp4" and self.peak_flops.fp4 is None:
            return DTYPE_BYTES["fp8"]
        return DTYPE_BYTES[dtype]


class Matrix(_Spec):
    """A dense projection: `groups` independent k x n GEMMs per layer."""

    name: str
    k: int = Field(gt=0)
    n: int = Field(gt=0)
    groups: int = Field(1, gt=0)
    tp_split: bool = False

    @property
    def params(self) -> int:
        return self.k * self.n * self.groups


class AttentionCode(_Spec):
    ratio: int = Field(ge=0, description="KV compression ratio (0 = sliding window only)")
    indexer: bool = False


class AttentionSpec(_Spec):
    heads: int = Field(gt=0)
    qk_head_dim: int = Field(gt=0)
    v_head_dim: int = Field(gt=0)
    prefill_qk_head_dim: int | None = Field(
        None, gt=0, description="per-head q.k width of the prefill kernel where it runs another form "
        "(MLA prefill: non-absorbed, nope + rope); None: qk_head_dim")
    prefill_v_head_dim: int | None = Field(None, gt=0, description="the same for values; None: v_head_dim")
    math_dtype: Dtype
    window: int = Field(ge=0)
    window_entry_bytes: float = Field(ge=0)
    compressed_entry_bytes: float = Field(gt=0)
    layer_codes: list[int]
    codes: dict[int, AttentionCode]
    matrices: list[Matrix]

    def flops_per_entry(self, phase: str, tp: int) -> float:
        """FLOPs of one query against one KV entry on one GPU of a tp-way split: q.k and p.v over
        the heads, at the widths the phase's kernel runs (prefill_*_head_dim in prefill)."""
        qk, v = self.qk_head_dim, self.v_head_dim
        if phase == "prefill":
            qk = self.prefill_qk_head_dim or qk
            v = self.prefill_v_head_dim or v
        return 2.0 * (self.heads / tp) * (qk + v)

    @model_validator(mode="after")
    def _codes_known(self) -> AttentionSpec:
        unknown = sorted(set(self.layer_codes) - set(self.codes))
        if unknown:
            raise ValueError(f"layer_codes: codes {unknown} are not defined in attention.codes")
        return self


class IndexerSpec(_Spec):
    heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    top_k: int = Field(gt=0)
    key_bytes: float = Field(gt=0)
    score_bytes: float = Field(0.0, ge=0, description="per scanned key: score out + top-k read back")
    matrices: list[Matrix]


class MoESpec(_Spec):
    experts: int = Field(gt=0)
    shared_experts: int = Field(ge=0)
    top_k: int = Field(gt=0)
    intermediate: int = Field(gt=0)
    expert_bytes: float = Field(gt=0)
    weight_dtype: Dtype
    math_dtype: Dtype | None = Field(
        None, description="routed GEMM math (None: FP8, or FP4 under the fp8xfp4-k64 switch)")
    shared_dtype: Dtype
    first_dense_layers: int = Field(ge=0)
    dense_intermediate: int = Field(ge=0)
    gate_flops_per_expert: float = Field(gt=0)
    megagate_candidate_fraction: float = Field(gt=0, le=1)
    imbalance_dispersion: float = Field(ge=0)

    @property
    def expert_params(self) -> int:
        return 3 * self.intermediate  # times hidden, applied by the caller


class PrefillSpec(_Spec):
    full_layers: int = Field(gt=0)
    tail_tokens: int = Field(ge=0)


class MHCSpec(_Spec):
    streams: int = Field(gt=0)
    sinkhorn_iters: int = Field(ge=0)
    elem_bytes: float = Field(gt=0)
    passes_per_sublayer: int = Field(gt=0)


class EngramSpec(_Spec):
    layers: list[int]
    rows_per_token: int = Field(gt=0)
    row_bytes: float = Field(gt=0)
    table_rows: list[int] = Field(
        default_factory=list, description="rows of each table (HBM they take)"
    )


class MTPSpec(_Spec):
    """Speculative decoding by the model's own draft layers (multi-token prediction)."""

    draft_layers: int = Field(gt=0)
    experts: int = Field(gt=0)
    top_k: int = Field(gt=0)
    block_tokens: int = Field(ge=2, description="positions verified per sequence per step")
    draft_attention_code: int = Field(ge=0)
    acceptance: list[float] = Field(
        description="per draft position, P(accepted | every earlier draft accepted): the shape"
    )
    acceptance_length: float | None = Field(
        None, ge=1.0, description="tokens a sequence gains per step (the benchmark's pinned value); "
        "None: what the per-position rates give"
    )

    @model_validator(mode="after")
    def _one_rate_per_draft(self) -> MTPSpec:
        if len(self.acceptance) != self.block_tokens - 1:
            raise ValueError(
                f"acceptance: {len(self.acceptance)} rates for {self.block_tokens - 1} drafts"
            )
        if not all(0.0 <= a <= 1.0 for a in self.acceptance):
            raise ValueError("acceptance: every rate must be in [0, 1]")
        if self.acceptance_length is not None and self.acceptance_length > self.block_tokens:
            raise ValueError(f"acceptance_length: at most block_tokens ({self.block_tokens}), "
                             f"got {self.acceptance_length}")
        return self


class ModelSpec(_Spec):
    """The served model's shapes and formats (everything the step cost needs)."""

    name: str
    vocab: int = Field(gt=0)
    hidden: int = Field(gt=0)
    layers: int = Field(gt=0)
    dense_dtype: Dtype
    lm_head_dtype: Dtype
    kv_bytes_per_token: float = Field(gt=0)
    window_buffer_bytes: float = Field(ge=0)
    attention: AttentionSpec
    indexer: IndexerSpec | None = None
    moe: MoESpec
    prefill: PrefillSpec
    mhc: MHCSpec | None = None
    engram: EngramSpec | None = None
    mtp: MTPSpec | None = None

    def derived_kv_bytes_per_token(self) -> float:
        """KV a token leaves in HBM past the window: per layer, its compressed entry (and indexer key
        where the layer runs the indexer) divided by the layer's compression ratio."""
        total = 0.0
        for code in self.attention.layer_codes:
            c = self.attention.codes[code]
            if c.ratio == 0:
                continue
            key = self.indexer.key_bytes if (c.indexer and self.indexer) else 0.0
            total += (self.attention.compressed_entry_bytes + key) / c.ratio
        return total

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        if len(self.attention.layer_codes) != self.layers:
            raise ValueError(
                f"attention.layer_codes: {len(self.attention.layer_codes)} entries for {self.layers} layers"
            )
        if self.prefill.full_layers > self.layers:
            raise ValueError(
                f"prefill.full_layers: {self.prefill.full_layers} > layers {self.layers}"
            )
        if self.mtp and self.mtp.draft_attention_code not in self.attention.codes:
            raise ValueError(
                f"mtp.draft_attention_code: {self.mtp.draft_attention_code} is not in attention.codes"
            )
        if any(c.indexer for c in self.attention.codes.values()) and self.indexer is None:
            raise ValueError("indexer: required when an attention code uses the indexer")
        return self


def _validated(cls: type[_Spec], data: Any, origin: str) -> Any:
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors()
        )
        raise ValueError(f"invalid {cls.__name__} {origin}: {problems}") from None


def parse_hardware(data: dict[str, Any], origin: str = "<dict>") -> HardwareSpec:
    return _validated(HardwareSpec, data, origin)


def parse_model(data: dict[str, Any], origin: str = "<dict>") -> ModelSpec:
    return _validated(ModelSpec, data, origin)


def _read(kind: str, name: str) -> tuple[dict[str, Any], str]:
    path = SPEC_DIR / kind / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(available(kind))
        raise ValueError(f"{kind}: unknown {kind} spec {name!r} (known: {known})")
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: top level must be a mapping")
    return data, str(path)


def available(kind: Literal["hardware", "model"]) -> list[str]:
    return sorted(p.stem for p in (SPEC_DIR / kind).glob("*.yaml"))


@cache
def load_hardware(name: str) -> HardwareSpec:
    data, origin = _read("hardware", name)
    return parse_hardware(data, origin)


@cache
def load_model(name: str) -> ModelSpec:
    data, origin = _read("model", name)
    return parse_model(data, origin)
