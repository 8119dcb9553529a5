"""One typed config for a whole deployment: YAML file + `RACKSERVE_<SECTION>__<FIELD>` env overrides.

Every section is a pydantic model that forbids unknown fields, so a typo fails at load with a
message naming the field. No other module reads environment variables.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, model_validator

from rackserve.planner.settings import PlannerSettings

ENV_PREFIX = "RACKSERVE_"


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineSection(Section):
    """The small MoE model the workers really execute, and its paged KV."""

    # "real" runs the small model; "mock" keeps the scheduler, block hashing, cache, pool, events
    # and pacing but emits deterministic pseudo-tokens (rackserve/model/mock_engine.py).
    kind: Literal["real", "mock"] = "real"
    mock_ranks: Literal["actor", "service"] = Field(
        "actor", description="engine.kind mock: an instance's ranks in one Ray actor (a killed actor restarts "
        "them), or in the worker service's own process on a thread of their own (no Ray hop per step, as "
        "Dynamo's mocker steps inside its worker; they live and restart with the service)")
    model_id: str = "rackserve-moe-small"
    seed: int = 0
    block_size: int = Field(16, gt=0, description="tokens per KV block")
    max_context: int = Field(8192, gt=0, description="longest prompt + output, in tokens (a 4096-token prompt fits with room to generate)")
    cache_blocks_per_rank: int = Field(4096, gt=0, description="HBM block cache per rank (small model)")
    # Scheduler limits per rank (rackserve/sched/limits.py): vLLM v1's defaults for its OpenAI server
    # on a >= 70 GiB GPU. The older names prefill_chunk_tokens / max_batch_seqs are still accepted.
    max_num_batched_tokens: int = Field(
        8192, gt=0, description="tokens computed per step (vLLM max_num_batched_tokens)",
        validation_alias=AliasChoices("max_num_batched_tokens", "prefill_chunk_tokens"),
    )
    max_num_seqs: int = Field(
        1024, gt=0, description="running requests per rank (vLLM max_num_seqs)",
        validation_alias=AliasChoices("max_num_seqs", "max_batch_seqs"),
    )
    max_queue_seqs: int = Field(
        4096, gt=0, description="requests admitted per rank (waiting + running); more get RESOURCE_EXHAUSTED / 429",
    )


class SpeculativeSection(Section):
    """Speculative decoding (MTP) as a benchmark parameter (rackserve/timing/speculative.py)."""

    acceptance_length: float | None = Field(
        None, ge=1.0, description="accepted tokens per decode step; None: the model spec's pinned value "
        "(DeepSeek-V4.1-Flash: 2.49, the AgentX/InferenceX golden value)")
    # "mean": every request accepts the length in every step; "sampled": each request its own mean,
    # drawn from the acceptance model's per-step distribution over its steps (P90 then carries variance)
    acceptance: Literal["mean", "sampled"] = "mean"
    drafts: int | None = Field(
        None, gt=0, description="draft tokens verified per step (TensorRT-LLM num_nextn_predict_layers); "
        "None: the model spec's")


class TimingSection(Section):
    """The cost model: which target GPU, model and kernel optimizations to charge."""

    hardware: str = "vr200"
    model: str = "deepseek-v4.1-flash"
    optimizations: str = Field("rubin-optimized", description="preset name or comma-separated switches")
    target_block_tokens: int = Field(64, gt=0, description="KV block size of the target deployment")
    # Where the target's Engram tables live (rackserve/timing/engram_placement.py): "hbm-sharded" (the
    # reference: sharded over every GPU's HBM, rows over NVLink) or "host-copy" (a copy in host DRAM per CPU
    # an instance spans, rows over the CPU-GPU link).
    engram_placement: Literal["hbm-sharded", "host-copy"] = "hbm-sharded"
    speculative: SpeculativeSection = SpeculativeSection()
    # The routed experts' format where the deployment serves another checkpoint than the model spec's
    # (rackserve/timing/precision.py): fp8, nvfp4 (NVFP4 weights and activations), w4a8. None: the spec's.
    expert_precision: Literal["fp8", "nvfp4", "w4a8"] | None = None
    attention_math: Literal["bf16", "fp8"] | None = Field(
        None, description="the attention kernels' math (fp8: over an FP8 KV cache); None: the model spec's")


class InstanceGroup(Section):
    """Instances of one layout (rackserve/timing/layout.py): dep2, wide-ep (ranks), tp8, and the general
    dep (DP attention + EP over `ranks` GPUs) and tep (TP attention + EP), each expert split moe_tp ways."""

    layout: Literal["dep2", "wide-ep", "tp8", "dep", "tep"]
    count: int = Field(1, ge=0)
    ranks: int | None = Field(None, gt=0, description="GPUs per instance (wide-ep, dep, tep); fixed for dep2/tp8")
    moe_tp: int = Field(1, gt=0, description="dep / tep: each routed expert's columns split this many ways")

    @model_validator(mode="after")
    def _ranks_match_layout(self) -> InstanceGroup:
        fixed = {"dep2": 2, "tp8": 8}
        if self.layout in fixed and self.ranks not in (None, fixed[self.layout]):
            raise ValueError(f"ranks: {self.layout} has {fixed[self.layout]} ranks, got {self.ranks}")
        if self.layout in ("dep", "tep") and self.ranks is None:
            raise ValueError(f"ranks: {self.layout} needs its GPU count")
        if self.moe_tp != 1 and self.layout not in ("dep", "tep"):
            raise ValueError(f"moe_tp: only dep and tep split experts, not {self.layout}")
        if self.ranks and self.ranks % self.moe_tp:
            raise ValueError(f"moe_tp: must divide ranks ({self.ranks}), got {self.moe_tp}")
        return self

    @property
    def gpus(self) -> int:
        return {"dep2": 2, "tp8": 8}.get(self.layout, self.ranks or 8)

    @property
    def dp_ranks(self) -> int:
        """Data-parallel ranks that hold their own batch and KV (tp8 and tep are one rank of all their GPUs)."""
        if self.layout in ("tp8", "tep"):
            return 1
        return self.gpus


class DeploymentSection(Section):
    """Disaggregated prefill and decode instances, or (`aggregated`) instances that do both: in-flight
    batching, prompts' chunks mixed into the decode steps of the same ranks (rackserve/sim/aggregated.py).
    A deployment is one or the other; naming `aggregated` leaves prefill and decode empty."""

    prefill: list[InstanceGroup] = Field(default_factory=lambda: [InstanceGroup(layout="dep2")])
    decode: list[InstanceGroup] = Field(
        default_factory=lambda: [InstanceGroup(layout="wide-ep", ranks=4), InstanceGroup(layout="tp8")]
    )
    aggregated: list[InstanceGroup] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _aggregated_alone(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not data.get("aggregated"):
            return data
        mixed = [role for role in ("prefill", "decode") if data.get(role)]
        if mixed:
            raise ValueError(f"aggregated: serves alone; drop {' and '.join(mixed)} (a deployment mixing "
                             "P/D and aggregated instances is not modelled)")
        return {**data, "prefill": [], "decode": []}

    @property
    def is_aggregated(self) -> bool:
        return any(g.count for g in self.aggregated)


class PoolSection(Section):
    """Mooncake-style KV pool: target capacities (bytes of the emulated rack) and a real Redis budget."""

    hbm_capacity_bytes: int = Field(2 * 1024**4, ge=0, description="spare HBM across the rack")
    dram_capacity_bytes: int = Field(16 * 1024**4, ge=0, description="host DRAM across the rack")
    redis_budget_bytes: int = Field(2 * 1024**3, gt=0, description="actual bytes allowed in Redis")
    high_watermark: float = Field(0.95, gt=0, le=1)
    low_watermark: float = Field(0.85, gt=0, le=1)
    lease_s: float = Field(30.0, gt=0)
    mock_bytes: bool = Field(
        True, description="engine.kind mock: pool values sized like the target's KV (false: empty)"
    )
    # Who shares the pool (rackserve/sim/pool_scope.py): "rack" = one pool of the decode GPUs' spare HBM
    # and every tray's host DRAM, for every prefill rank; "instance" = each prefill instance offloads to
    # its own trays' host DRAM only, over its CPU-GPU link (vLLM's CPU offload); "agentx" = "instance"
    # capped at 3 TB per 8 GPUs (AgentX's KV-offload rule, REFERENCE.md "How the benchmark measures");
    # "none" = no pool; "deployment" = a Mooncake store over the trays the deployment occupies (prefill
    # and decode), of the capacity it configures below (segment_bytes_per_host, hbm_lent_bytes_per_gpu).
    scope: Literal["rack", "instance", "agentx", "none", "deployment"] = "rack"
    # pool.scope deployment: what each host contributes to the store (Mooncake's global_segment_size, host
    # DRAM). None: 80 GB per GPU of the deployment on the host, vLLM's MooncakeStoreConnector recipe
    # (docs.vllm.ai features/mooncake_store_connector_usage: "global_segment_size": "80GB" in embedded
    # mode, where each rank contributes its global_segment_size in-process; one rank per GPU).
    segment_bytes_per_host: int | None = Field(None, ge=0, description="deployment scope: store segment per host")
    # pool.scope deployment: spare HBM each decode GPU lends to the store (capped at what it has spare).
    # 0: the recipes register host DRAM only (vLLM's MooncakeStoreConnector, Dynamo KVBM's host tier,
    # LMCache's local CPU backend); the engines keep their HBM as their own KV cache.
    hbm_lent_bytes_per_gpu: int = Field(0, ge=0, description="deployment scope: spare HBM lent per decode GPU")
    # Per-transfer setup of a pool read or write (submit + completion + metadata round trip), on top of
    # bytes / bandwidth: spare HBM over NVLink ~ NCCL's LL base latency 6.6 us; host DRAM over RDMA ~ one
    # DeepEP low-latency RDMA round, EP8 dispatch 77 us at 128 tokens (REFERENCE.md, public parameters).
    hbm_transfer_setup_s: float = Field(6.6e-6, ge=0, description="setup of one spare-HBM pool transfer")
    dram_transfer_setup_s: float = Field(77e-6, ge=0, description="setup of one host-DRAM pool transfer")
    prefetch_while_queued: bool = Field(
        True, description="a prefill rank starts fetching a prompt's pooled KV when it queues the prompt",
    )

    @model_validator(mode="after")
    def _watermarks_ordered(self) -> PoolSection:
        if self.low_watermark >= self.high_watermark:
            raise ValueError("low_watermark must be below high_watermark")
        return self


class EngramSection(Section):
    shards: int = Field(4, gt=0)
    table_rows: int = Field(1 << 16, gt=0, description="rows per table of the small model")
    cache_rows: int = Field(
        16384, ge=0, description="rows per table a rank keeps from earlier lookups (0 = none)"
    )


class RoutingSection(Section):
    """Router policy by name (rackserve.routing registry) and the knobs of the comparison policies."""

    policy: str = "least-uncached-work"
    seed: int = 0
    overlap_score_weight: float = Field(1.0, ge=0, description="dynamo-kv: prefill-block weight")
    temperature: float = Field(0.0, ge=0, description="dynamo-kv: softmax temperature, 0 = argmin")
    prefix_hash_blocks: int = Field(4, gt=0, description="prefix-hash: leading blocks hashed")
    # dynamo-kv, as ai-dynamo/dynamo docs/components/router/router-configuration.md names its knobs:
    # cost = prefill_load_scale x max(active prefill blocks + prompt blocks - overlap credit, 0)
    #        + active decode blocks + new blocks, overlap credit weighted by tier.
    prefill_load_scale: float = Field(1.0, ge=0, description="dynamo-kv: weight of the prefill blocks (Dynamo's default 1)")
    overlap_score_credit: float = Field(1.0, ge=0, description="dynamo-kv: credit per block in the rank's HBM (device tier, 1.0)")
    pool_hbm_hit_weight: float = Field(0.75, ge=0, le=1, description="dynamo-kv: credit per pooled spare-HBM block (a shared cache; Dynamo's host weight taken)")
    host_cache_hit_weight: float = Field(0.75, ge=0, le=1, description="dynamo-kv: credit per pooled host-DRAM block (Dynamo's default 0.75)")
    lockstep_balance: bool = Field(
        True, description="least-uncached-work: charge the idle a pick forces on its lockstep sibling ranks",
    )
    # How long a KV event takes from its publisher to the router's index (stored blocks are invisible to
    # routing before): the live stack's Redis-stream lag, XADD -> the router's blocking XREAD, measured on
    # loopback at p50 0.36 ms, p90 0.49 ms, p99 4.7 ms (bench/routing/event_lag.py -> bench/results/routing/event_lag.json);
    # the default is the p90, rounded (read as simulated seconds, i.e. time_scale 1).
    event_lag_s: float = Field(5e-4, ge=0, description="KV event lag, simulated seconds")

    @model_validator(mode="after")
    def _known_policy(self) -> RoutingSection:
        from rackserve.routing.policy import policy_names  # the registry lives with the policies

        if self.policy not in policy_names():
            known = ", ".join(policy_names())
            raise ValueError(f"policy: unknown policy {self.policy!r}; known: {known}")
        return self


class ClusterSection(Section):
    """Where the live services listen and how fast the twin's clock runs."""

    host: str = "127.0.0.1"
    http_port: int = Field(8000, ge=0, le=65535)
    time_scale: float = Field(1.0, ge=0, description="wall seconds per simulated second; 0 = unpaced")
    redis_url: str | None = Field(None, description="external Redis; None starts an embedded one")
    ray_address: str | None = None
    prometheus: bool = True
    # Front door limits and security (issue 9; enforced by services/router/limits.py).
    public_bind: bool = Field(False, description="allow a non-loopback host (logged at start)")
    api_key: str | None = Field(None, repr=False, description="Bearer key for /v1 and /admin")
    api_key_file: str | None = Field(None, description="file whose first line is the Bearer key")
    max_body_bytes: int = Field(1 << 20, gt=0, description="larger request bodies get 413")
    max_json_depth: int = Field(32, gt=0, description="deeper JSON request bodies get 400")
    max_in_flight: int = Field(256, gt=0, description="front-door requests served at once")
    max_queued: int = Field(1024, ge=0, description="requests waiting for a slot; more get 429")
    queue_timeout_s: float = Field(30.0, gt=0, description="longest wait for a slot, then 503")
    worker_timeout_s: float = Field(120.0, gt=0, description="prefill call deadline; then re-route")
    decode_chunk_timeout_s: float = Field(60.0, gt=0, description="longest wait for a decode chunk; then migrate")
    health_interval_s: float = Field(1.0, gt=0, description="router's worker health probe period")


class Config(Section):
    engine: EngineSection = EngineSection()
    timing: TimingSection = TimingSection()
    deployment: DeploymentSection = DeploymentSection()
    pool: PoolSection = PoolSection()
    engram: EngramSection = EngramSection()
    routing: RoutingSection = RoutingSection()
    cluster: ClusterSection = ClusterSection()
    workload: dict[str, Any] = Field(default_factory=dict, description="workload spec (see rackserve.workload)")
    # Issue 52: the planner scales prefill and decode instances (rackserve/planner); the simulator
    # (rackserve/sim/planned.py) and the live router (services/router/planner_loop.py) both run it.
    planner: PlannerSettings | None = None
    # A simulator scenario (scenarios/*.yaml) is also a deployment `rackserve up` can serve: its
    # name, description and simulator knobs are kept here and not read by the live cluster.
    name: str = ""
    description: str = ""
    sim: dict[str, Any] = Field(default_factory=dict, description="simulator knobs (rackserve sim)")


def _env_overrides(environ: dict[str, str]) -> dict[str, Any]:
    """`RACKSERVE_CLUSTER__TIME_SCALE=0` -> {"cluster": {"time_scale": 0}} (values parsed as YAML)."""
    out: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX) or "__" not in key:
            continue
        path = key[len(ENV_PREFIX) :].lower().split("__")
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = yaml.safe_load(raw)
    return out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_config(path: str | Path | None = None, environ: dict[str, str] | None = None) -> Config:
    """Load YAML (if given), apply env overrides, validate. Raises ValueError naming the bad field."""
    data: dict[str, Any] = {}
    if path is not None:
        text = Path(path).read_text()
        data = yaml.safe_load(text) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    data = _merge(data, _env_overrides(dict(os.environ if environ is None else environ)))
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"invalid config{f' {path}' if path else ''}: {problems}") from None
