"""Memory capacity of a deployment from the hardware and model specs: weights, workspace and KV per rank,
the rack pool's two tiers (spare HBM, host DRAM) with their paths' bandwidth, and vLLM-style batch limits.

Per GPU: KV bytes = HBM - weights - Engram shard - workspace, where workspace is what vLLM keeps out of
the KV cache (1 - gpu_memory_utilization of HBM, plus the activations of one max_num_batched_tokens step).
Prefill ranks spend their KV bytes on their own prefix cache; decode ranks keep the KV the workload holds
(its P99 per rank, estimated from the workload by rackserve.sim.sizing; without an estimate, the old
worst case of `max_num_seqs` slots of `decode_context_tokens`), admit against it by KV tokens (vLLM
admits by free KV blocks; `max_num_seqs` stays a cap, not a reservation), and lend the rest to the
pool's spare-HBM tier. The DRAM tier is the host DRAM of every tray the deployment
occupies, less a host reserve. A deployment whose weights and workspace do not fit raises ValueError
saying which rank, by how many bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rackserve.timing import engram_placement as ep
from rackserve.timing.layout import Layout, make_layout
from rackserve.timing.spec import DTYPE_BYTES, HardwareSpec, ModelSpec

# vLLM defaults for GPUs with >= 70 GiB (vllm-project/vllm vllm/engine/arg_utils.py get_batch_defaults,
# OPENAI_API_SERVER usage context) and its default gpu_memory_utilization (vllm/config/cache.py).
VLLM_MAX_NUM_SEQS = 1024
VLLM_MAX_NUM_BATCHED_TOKENS = 8192
VLLM_GPU_MEMORY_UTILIZATION = 0.9
# Activations of one step per token: the mHC residual streams in and out (BF16) plus the routed
# experts' SwiGLU intermediate of its top-k experts (FP8). FREE: an estimate, not a profile.
ACT_RESIDUAL_COPIES = 2
HOST_RESERVED_FRACTION = 0.1  # FREE: host DRAM kept for the OS, the engine processes and pinned buffers
DECODE_CONTEXT_TOKENS = 200_000  # p90 input of the AgentX traces (data/agentx README): a decode slot's KV budget
GB = 1e9


@dataclass(frozen=True)
class GpuMemory:
    """Bytes on one GPU of a rank: what is fixed (weights, Engram shard, workspace) and what is left for KV."""

    hbm_bytes: float
    weights_bytes: float
    engram_bytes: float
    workspace_bytes: float

    @property
    def kv_bytes(self) -> float:
        return self.hbm_bytes - self.weights_bytes - self.engram_bytes - self.workspace_bytes


@dataclass(frozen=True)
class RankCapacity:
    """One data-parallel rank of a layout (tp8: one rank of 8 GPUs, its KV replicated on each)."""

    role: str  # "prefill" | "decode"
    layout: str  # Layout.key, e.g. "dep2", "wide-ep48"
    gpus_per_rank: int
    memory: GpuMemory  # per GPU
    kv_tokens: int  # prefill: prefix-cache tokens; decode: KV tokens the rank keeps for its batch
    max_num_seqs: int
    max_num_batched_tokens: int
    lent_bytes: float  # per GPU, given to the pool's spare-HBM tier
    # decode, per GPU: what the old rule reserved (max_num_seqs slots of decode_context_tokens) and the
    # workload's estimated P99 holding (None: unknown, the worst case is kept)
    worst_case_slots_bytes: float = 0.0
    held_estimate_bytes: float | None = None

    def to_dict(self) -> dict:
        m = self.memory
        out = {"role": self.role, "layout": self.layout, "gpus_per_rank": self.gpus_per_rank,
               "hbm_gb": m.hbm_bytes / GB, "weights_gb": m.weights_bytes / GB, "engram_gb": m.engram_bytes / GB,
               "workspace_gb": m.workspace_bytes / GB, "kv_gb": m.kv_bytes / GB, "kv_tokens": self.kv_tokens,
               "max_num_seqs": self.max_num_seqs, "max_num_batched_tokens": self.max_num_batched_tokens,
               "lent_gb": self.lent_bytes / GB}
        if self.role == "decode":
            out.update(kept_gb=(m.kv_bytes - self.lent_bytes) / GB,
                       worst_case_slots_gb=self.worst_case_slots_bytes / GB,
                       held_p99_estimate_gb=None if self.held_estimate_bytes is None else self.held_estimate_bytes / GB)
        return out


@dataclass(frozen=True)
class PoolPath:
    """A pool tier's capacity and the bandwidth of its path: `port` is one rank's own link (NVLink for
    spare HBM, its RDMA NIC for DRAM), `aggregate` what the tier serves to all ranks at once."""

    capacity_bytes: float
    port_bw_bytes_per_s: float
    aggregate_bw_bytes_per_s: float
    latency_s: float


@dataclass(frozen=True)
class DeploymentCapacity:
    prefill: tuple[RankCapacity, ...]  # one per prefill instance group
    decode: tuple[RankCapacity, ...]
    pool_hbm: PoolPath
    pool_dram: PoolPath
    kv_bytes_per_token: float
    window_buffer_bytes: float
    trays: int

    def to_dict(self) -> dict:
        def path(p: PoolPath) -> dict:
            return {"capacity_gb": p.capacity_bytes / GB, "port_gb_per_s": p.port_bw_bytes_per_s / GB,
                    "aggregate_gb_per_s": p.aggregate_bw_bytes_per_s / GB}

        return {"prefill": [r.to_dict() for r in self.prefill], "decode": [r.to_dict() for r in self.decode],
                "pool_hbm": path(self.pool_hbm), "pool_dram": path(self.pool_dram),
                "kv_bytes_per_token": self.kv_bytes_per_token, "trays": self.trays}


# ---- weights ------------------------------------------------------------------------------------
def _matrix_bytes(model: ModelSpec, hw: HardwareSpec, tp: int) -> float:
    """Dense projections of every layer (attention + indexer), tensor-parallel ones split by tp."""
    mats = list(model.attention.matrices) + (list(model.indexer.matrices) if model.indexer else [])
    params = sum(m.params / (tp if m.tp_split else 1) for m in mats)
    return params * model.layers * hw.stored_bytes(model.dense_dtype)


def _expert_bytes(model: ModelSpec, hw: HardwareSpec, layout: Layout) -> float:
    """Routed experts spread over ep ranks (and split by column over tp); shared experts and dense MLPs."""
    moe = model.moe
    moe_layers = model.layers - moe.first_dense_layers
    fp4_scale = hw.stored_bytes(moe.weight_dtype) / DTYPE_BYTES[moe.weight_dtype]
    routed = moe_layers * moe.experts * moe.expert_bytes * fp4_scale / (layout.ep * layout.expert_tp)
    shared = moe_layers * moe.shared_experts * 3 * model.hidden * moe.intermediate
    dense = moe.first_dense_layers * 3 * model.hidden * moe.dense_intermediate
    return routed + (shared * hw.stored_bytes(moe.shared_dtype) + dense * hw.stored_bytes(model.dense_dtype)) / layout.tp


def weights_bytes_per_gpu(model: ModelSpec, hw: HardwareSpec, layout: Layout) -> float:
    """Model weights one GPU of `layout` holds: projections, experts, embedding and LM head
    (vocab-parallel under tp). mHC mixing matrices (4x4 per sublayer) are negligible and left out."""
    vocab = 2 * model.vocab * model.hidden * hw.stored_bytes(model.lm_head_dtype) / layout.tp
    return _matrix_bytes(model, hw, layout.tp) + _expert_bytes(model, hw, layout) + vocab


def engram_bytes_total(model: ModelSpec) -> float:
    eg = model.engram
    return float(sum(eg.table_rows) * eg.row_bytes) if eg else 0.0


def workspace_bytes_per_gpu(model: ModelSpec, hw: HardwareSpec, batched_tokens: int,
                            gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION) -> float:
    streams = model.mhc.streams if model.mhc else 1
    per_token = (ACT_RESIDUAL_COPIES * streams * model.hidden * DTYPE_BYTES["bf16"]
                 + model.moe.top_k * 2 * model.moe.intermediate * DTYPE_BYTES["fp8"])
    return (1.0 - gpu_memory_utilization) * hw.hbm_bytes + batched_tokens * per_token


# ---- ranks --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Limits:
    """Scheduler limits and the decode KV budget (vLLM defaults unless overridden)."""

    max_num_seqs: int = VLLM_MAX_NUM_SEQS
    max_num_batched_tokens: int = VLLM_MAX_NUM_BATCHED_TOKENS
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION
    decode_context_tokens: int = DECODE_CONTEXT_TOKENS
    # The decode KV the workload holds per decode rank at its P99 (sequences, context tokens), when
    # known (rackserve.sim.sizing.decode_held_estimate); None: the worst case of max_num_seqs slots
    decode_held_seqs: int | None = None
    decode_held_tokens: int | None = None


def gpu_memory(model: ModelSpec, hw: HardwareSpec, layout: Layout, engram_gpus: int, limits: Limits,
               what: str, engram_placement: str = ep.HBM_SHARDED) -> GpuMemory:
    """One GPU of `layout`; ValueError when weights + Engram shard + workspace exceed its HBM."""
    mem = GpuMemory(hw.hbm_bytes, weights_bytes_per_gpu(model, hw, layout),
                    ep.hbm_bytes_per_gpu(engram_bytes_total(model), engram_gpus, engram_placement),
                    workspace_bytes_per_gpu(model, hw, limits.max_num_batched_tokens, limits.gpu_memory_utilization))
    if mem.kv_bytes <= 0:
        raise ValueError(
            f"{what}: does not fit on {hw.name}: {layout.key} holds {mem.weights_bytes / GB:.1f} GB of "
            f"{model.name} weights + {mem.engram_bytes / GB:.1f} GB Engram shard + {mem.workspace_bytes / GB:.1f} GB "
            f"workspace per GPU, {hw.hbm_bytes / GB:.1f} GB HBM: short by {-mem.kv_bytes / GB:.1f} GB")
    return mem


def prefill_rank(model: ModelSpec, hw: HardwareSpec, layout: Layout, engram_gpus: int, limits: Limits,
                 what: str, engram_placement: str = ep.HBM_SHARDED) -> RankCapacity:
    mem = gpu_memory(model, hw, layout, engram_gpus, limits, what, engram_placement)
    # running prompts keep their sliding-window buffers; the rest of the KV bytes is the prefix cache
    # (tp8 replicates the one shared KV head on each of its GPUs, so per-GPU bytes are per-rank tokens)
    cache = mem.kv_bytes - limits.max_num_seqs * model.window_buffer_bytes
    tokens = int(max(cache, 0.0) // model.kv_bytes_per_token)
    if tokens < limits.max_num_batched_tokens:
        raise ValueError(f"{what}: prefill rank {layout.key} on {hw.name} has room for {tokens:,} KV tokens, "
                         f"less than one step of {limits.max_num_batched_tokens:,} tokens")
    return RankCapacity("prefill", layout.key, layout.gpus // layout.dp, mem, tokens, limits.max_num_seqs,
                        limits.max_num_batched_tokens, 0.0)


def decode_rank(model: ModelSpec, hw: HardwareSpec, layout: Layout, engram_gpus: int, limits: Limits,
                what: str, engram_placement: str = ep.HBM_SHARDED) -> RankCapacity:
    """A decode rank keeps the KV its workload holds (limits.decode_held_*: the P99 estimate; else the
    worst case of max_num_seqs slots of decode_context_tokens), at least one slot and at most its HBM,
    and lends the rest; its KV-token budget is what its scheduler admits against, sequence by
    sequence, with max_num_seqs only a cap (vLLM admits by free KV blocks)."""
    mem = gpu_memory(model, hw, layout, engram_gpus, limits, what, engram_placement)
    win, per_token = model.window_buffer_bytes, model.kv_bytes_per_token
    slot_bytes = win + limits.decode_context_tokens * per_token
    if mem.kv_bytes < slot_bytes:
        raise ValueError(f"{what}: decode rank {layout.key} on {hw.name} has {mem.kv_bytes / GB:.1f} GB for KV, "
                         f"less than one {limits.decode_context_tokens:,}-token sequence "
                         f"({slot_bytes / GB:.2f} GB): short by {(slot_bytes - mem.kv_bytes) / GB:.2f} GB")
    worst = limits.max_num_seqs * slot_bytes
    held = None
    if limits.decode_held_tokens is None:
        kept, seqs = min(worst, mem.kv_bytes), min(limits.max_num_seqs, int(mem.kv_bytes // slot_bytes))
    else:
        seqs = max(1, limits.decode_held_seqs or 1)
        held = limits.decode_held_tokens * per_token + seqs * win
        kept = min(max(held, slot_bytes), mem.kv_bytes)
    tokens = int(max(kept - seqs * win, limits.decode_context_tokens * per_token) // per_token)
    return RankCapacity("decode", layout.key, layout.gpus // layout.dp, mem, tokens, limits.max_num_seqs,
                        limits.max_num_batched_tokens, mem.kv_bytes - kept, worst, held)


# ---- deployment ---------------------------------------------------------------------------------
def derive_capacity(model: ModelSpec, hw: HardwareSpec, prefill: list[tuple[Layout, int]],
                    decode: list[tuple[Layout, int]], limits: Limits = Limits(),
                    engram_placement: str = ep.HBM_SHARDED) -> DeploymentCapacity:
    """`prefill` / `decode`: (layout, instance count) per instance group. Engram tables are sharded over
    every GPU of the deployment (REFERENCE: "sharded across GPU HBM over NVLink"), or with `host-copy`
    held in host DRAM, one copy per CPU an instance spans, out of the DRAM tier (engram_placement.py)."""
    ep.check_placement(engram_placement)
    gpus = sum(lay.gpus * n for lay, n in (*prefill, *decode))
    pre = tuple(prefill_rank(model, hw, lay, gpus, limits, f"deployment.prefill[{i}]", engram_placement)
                for i, (lay, _) in enumerate(prefill))
    dec = tuple(decode_rank(model, hw, lay, gpus, limits, f"deployment.decode[{i}]", engram_placement)
                for i, (lay, _) in enumerate(decode))
    lenders = sum(lay.gpus * n for lay, n in decode)
    lent = sum(r.lent_bytes * lay.gpus * n for r, (lay, n) in zip(dec, decode, strict=True))
    nvlink = hw.nvlink_bw_bytes_per_s * hw.efficiency.nvlink
    pool_hbm = PoolPath(lent, nvlink, nvlink * max(lenders, 1), hw.nvlink_latency_s)
    trays = math.ceil(gpus / hw.gpus_per_tray)
    if hw.host_dram_bytes_per_tray is None or hw.nic_rdma_bw_bytes_per_s is None:
        raise ValueError(f"hardware {hw.name}: host_dram_bytes_per_tray and nic_rdma_bw_bytes_per_s are needed "
                         "for the pool's DRAM tier")
    nic = hw.nic_rdma_bw_bytes_per_s
    dram = PoolPath(trays * hw.host_dram_bytes_per_tray * (1 - HOST_RESERVED_FRACTION)
                    - engram_host_bytes(model, hw, [*prefill, *decode], engram_placement), nic,
                    nic * trays * hw.gpus_per_tray, hw.nvlink_latency_s)
    return DeploymentCapacity(pre, dec, pool_hbm, dram, model.kv_bytes_per_token, model.window_buffer_bytes, trays)


def engram_host_bytes(model: ModelSpec, hw: HardwareSpec, groups: list[tuple[Layout, int]], placement: str) -> float:
    """Host DRAM the Engram copies take (host-copy: one per CPU each instance spans; else none)."""
    copies = ep.host_copies(hw, [lay.gpus for lay, n in groups for _ in range(n)], placement)
    if copies:
        ep.check_copy_fits(hw, engram_bytes_total(model), 1 - HOST_RESERVED_FRACTION)
    return copies * engram_bytes_total(model)


def layouts_of(groups: list) -> list[tuple[Layout, int]]:
    """(layout, count) of config InstanceGroups (rackserve.config.DeploymentSection.prefill / .decode).
    Memory does not care about the 2..72 wide-ep range the cost model enforces."""
    out = []
    for g in groups:
        if g.layout == "wide-ep":
            out.append((Layout("wide-ep", gpus=g.gpus, dp=g.gpus, tp=1, ep=g.gpus), g.count))
        elif g.layout in ("dep", "tep"):
            out.append((make_layout(g.layout, g.gpus, g.moe_tp), g.count))
        else:
            out.append((make_layout(g.layout), g.count))
    return out
