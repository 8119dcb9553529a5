"""The scenario's `planner:` section: policy, tick, SLA targets, GPU budget, instance bounds and the
scaling costs (start-up delay). Errors name the field ("planner.tick_s: ...")."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# vLLM warm-up before an engine serves: CUDA-graph capture of its batch sizes (torch.compile cached).
# Measured: "CUDA Graph capture completed in 43 seconds" (vLLM 0.25.0, 32K capture profile;
# huggingface.co/nvidia/Nemotron-3-Embed-1B-NVFP4 discussion 4). A scenario may set its own.
VLLM_WARMUP_S = 43.0

# Dynamo's load-based planner defaults (ai-dynamo/dynamo components/planner docs, "PlannerDefaults"):
# decode-kv-scale-up-threshold 0.9, decode-kv-scale-down-threshold 0.5,
# prefill-queue-scale-up-threshold 0.5, prefill-queue-scale-down-threshold 0.2.
DYNAMO_KV_UP, DYNAMO_KV_DOWN = 0.9, 0.5
DYNAMO_QUEUE_UP, DYNAMO_QUEUE_DOWN = 0.5, 0.2


class PlannerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: Literal["fixed", "load", "sla"] = "fixed"
    tick_s: float = Field(30.0, gt=0, description="seconds between decisions (Dynamo adjustment-interval: 30)")
    metric_pull_s: float = Field(
        1.0, gt=0, description="seconds between samples of queues and KV use, averaged over the tick "
        "(Dynamo metric-pulling-interval: 1)")
    ttft_target_s: float = Field(2.0, gt=0, description="TTFT SLA (attainment and the sla policy)")
    itl_target_s: float = Field(0.05, gt=0, description="ITL SLA: seconds per output token after the first")
    gpu_budget: int | None = Field(None, gt=0, description="GPUs prefill + decode may hold (None: all built)")
    min_prefill: int = Field(1, ge=1)
    max_prefill: int | None = Field(None, ge=1, description="None: the deployment's prefill count")
    min_decode: int = Field(1, ge=1)
    max_decode: int | None = Field(None, ge=1, description="None: the deployment's decode count")
    initial_prefill: int | None = Field(None, ge=1, description="active at t=0 (None: max_prefill)")
    initial_decode: int | None = Field(None, ge=1, description="active at t=0 (None: max_decode)")
    startup_s: float | None = Field(
        None, ge=0, description="OVERRIDE of the start-up delay: weights / weight_load_bw + warmup_s")
    weight_load_bw_bytes_per_s: float | None = Field(
        None, gt=0, description="per GPU; None: the hardware's host link (weights staged in host DRAM)")
    warmup_s: float = Field(VLLM_WARMUP_S, ge=0, description="engine warm-up after the weights load")
    queue_up: float = Field(DYNAMO_QUEUE_UP, ge=0, description="load: queued prefill steps per instance to add one")
    queue_down: float = Field(DYNAMO_QUEUE_DOWN, ge=0, description="load: ... below which one drains")
    kv_up: float = Field(DYNAMO_KV_UP, gt=0, le=1, description="load: decode KV use to add one")
    kv_down: float = Field(DYNAMO_KV_DOWN, ge=0, lt=1, description="load: decode KV use below which one drains")
    headroom: float = Field(0.85, gt=0, le=1, description="sla: highest utilisation a candidate may plan for")

    @model_validator(mode="after")
    def _ordered(self) -> PlannerSettings:
        if self.metric_pull_s > self.tick_s:
            raise ValueError("metric_pull_s must be at most tick_s")
        if self.queue_down >= self.queue_up:
            raise ValueError("queue_down must be below queue_up")
        if self.kv_down >= self.kv_up:
            raise ValueError("kv_down must be below kv_up")
        for role in ("prefill", "decode"):
            hi = getattr(self, f"max_{role}")
            if hi is not None and hi < getattr(self, f"min_{role}"):
                raise ValueError(f"max_{role} must be at least min_{role}")
        return self
