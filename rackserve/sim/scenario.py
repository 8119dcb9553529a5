"""A simulator scenario: the deployment Config, the workload spec and the simulator's own knobs.

A scenario YAML is a rackserve Config (deployment / pool / timing / routing / workload sections)
plus an optional `sim:` section (SimSettings) and a `name`. Errors name the bad field.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rackserve.config import Config
from rackserve.planner.settings import PlannerSettings
from rackserve.workload.spec import (
    AgentXWorkload,
    MooncakeWorkload,
    UniformWorkload,
    parse_workload,
)


class SimSettings(BaseModel):
    """The simulator's own fields. Capacities and batch limits are derived from the specs
    (rackserve.sim.sizing); the fields marked OVERRIDE replace a derived value only when set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_num_seqs: int | None = Field(None, gt=0, description="vLLM max_num_seqs (None: vLLM default 1024)")
    max_num_batched_tokens: int | None = Field(
        None, gt=0, description="vLLM max_num_batched_tokens = prefill tokens per step per rank (None: 8192)")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="vLLM's (None: 0.9)")
    decode_context_tokens: int | None = Field(
        None, gt=0, description="KV budget per decode slot; the rest of a decode GPU is lent to the pool (None: 200k)")
    prefill_chunk_tokens: int | None = Field(None, gt=0, description="OVERRIDE of max_num_batched_tokens for prefill")
    prefill_max_batch_seqs: int | None = Field(None, gt=0, description="OVERRIDE of max_num_seqs for prefill")
    decode_max_batch_seqs: int | None = Field(None, gt=0, description="OVERRIDE of the decode batch limit")
    max_queue_per_rank: int = Field(100_000, gt=0, description="waiting + running; more is rejected")
    rank_cache_tokens: int | None = Field(None, gt=0, description="OVERRIDE of the prefill rank's HBM prefix cache")
    decode_kv_tokens_per_rank: int | None = Field(
        None, gt=0, description="OVERRIDE of the decode rank's KV budget; when set, decode ranks count blocks and "
        "preempt the newest sequence (recompute) when full, instead of reserving each request's whole output")
    decode_paged: bool = Field(
        False, description="decode ranks count KV blocks of the derived budget and preempt when they run out "
        "(vLLM's paged admission, step by step); off: the lazy batch admits by the same KV budget but "
        "reserves each request's whole output (faster, never preempts)")
    decode_max_num_batched_tokens: int = Field(
        8192, gt=0, description="decode rank token budget per step (vLLM default; bounds resumed recompute)")
    kv_block_multiple: int = Field(
        1, gt=0, description="track KV in groups of this many target blocks (1 = exact; 8 = 512 tokens, faster)")
    adp_balance_timeout_iters: int | None = Field(
        None, ge=0, description="aggregated instances: TensorRT-LLM's attention-DP balance (attention_dp_config "
        "enable_balance, timeout_iters): prompts wait until every rank has one, or this many steps (None: off)")
    horizon_s: float | None = Field(None, gt=0, description="ignore arrivals after this time")
    measure_start_s: float = Field(0.0, ge=0, description="start of the measured window (simulated s)")
    measure_duration_s: float | None = Field(
        None, gt=0, description="length of the measured window; the run stops at its end (AgentX: >= 900 s)")


@dataclass(frozen=True)
class Scenario:
    name: str
    config: Config
    workload: MooncakeWorkload | AgentXWorkload | UniformWorkload
    sim: SimSettings
    planner: PlannerSettings | None = None  # issue 52: instances activated and drained each tick

    def with_workload(self, workload: MooncakeWorkload | AgentXWorkload | UniformWorkload) -> Scenario:
        return replace(self, workload=workload)

    @property
    def gpus(self) -> int:
        dep = self.config.deployment
        return sum(g.count * g.gpus for g in (*dep.prefill, *dep.decode, *dep.aggregated))


def _errors(prefix: str, exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{prefix}{loc}: {err['msg']}")
    return "; ".join(parts)


def scenario_from_dict(data: dict[str, Any], name: str = "scenario") -> Scenario:
    """Validate a scenario mapping; ValueError names the bad field (e.g. "sim.prefill_chunk_tokens")."""
    if not isinstance(data, dict):
        raise ValueError(f"{name}: top level must be a mapping")
    data = dict(data)
    name = str(data.pop("name", name))
    data.pop("description", None)
    sim_raw = data.pop("sim", {}) or {}
    try:
        sim = SimSettings.model_validate(sim_raw)
    except ValidationError as exc:
        raise ValueError(_errors("sim.", exc)) from None
    planner_raw = data.pop("planner", None)
    try:
        planner = None if planner_raw is None else PlannerSettings.model_validate(planner_raw)
    except ValidationError as exc:
        raise ValueError(_errors("planner.", exc)) from None
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ValueError(_errors("", exc)) from None
    if config.deployment.is_aggregated:
        if planner is not None:
            raise ValueError("planner: aggregated deployments are not planned (prefill and decode roles only)")
        return Scenario(name, config, parse_workload(config.workload), sim)
    if not config.deployment.prefill or not any(g.count for g in config.deployment.prefill):
        raise ValueError("deployment.prefill: at least one prefill instance is needed")
    if not config.deployment.decode or not any(g.count for g in config.deployment.decode):
        raise ValueError("deployment.decode: at least one decode instance is needed")
    return Scenario(name, config, parse_workload(config.workload), sim, planner)


def load_scenario(path: str | Path) -> Scenario:
    """Load a scenario file; a relative Mooncake trace path is taken from the file's folder."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML ({exc})") from None
    workload = data.get("workload") if isinstance(data, dict) else None
    if isinstance(workload, dict) and isinstance(workload.get("trace"), str):
        workload["trace"] = str((path.parent / workload["trace"]).resolve())
    try:
        return scenario_from_dict(data, name=path.stem)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
