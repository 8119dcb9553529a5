"""Per-rank scheduler limits, with vLLM v1's defaults.

vLLM v1 (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults) on a GPU with >= 70 GiB (H100,
H200, and the GB200/GB300/Rubin parts this project emulates), for the OpenAI API server:
max_num_batched_tokens = 8192 and max_num_seqs = 1024 (the offline LLM class: 16384 / 1024; GPUs
below 70 GiB: 2048 / 256). v1 always chunks prefills, schedules running requests before waiting
ones and preempts by recompute. It has no queue bound; ours (`max_queue`) makes admission push back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

VLLM_MAX_NUM_BATCHED_TOKENS = 8192  # OpenAI API server, >= 70 GiB GPU
VLLM_MAX_NUM_SEQS = 1024
DEFAULT_MAX_QUEUE = 10_000  # waiting + running per rank; beyond it admission is refused

PreemptionMode = Literal["recompute"]


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_batched_tokens: int = VLLM_MAX_NUM_BATCHED_TOKENS  # tokens computed per step
    max_num_seqs: int = VLLM_MAX_NUM_SEQS  # running sequences (each scheduled at most once a step)
    max_queue: int = DEFAULT_MAX_QUEUE
    preemption_mode: PreemptionMode = "recompute"
    # The simulator's lazy decode path only: admit while the batch's final contexts (prompt + every
    # output) fit, so no running sequence ever needs preempting (None: no KV limit).
    reserve_kv_tokens: int | None = None

    def __post_init__(self) -> None:
        assert self.max_num_batched_tokens > 0 and self.max_num_seqs > 0 and self.max_queue > 0
        assert self.preemption_mode == "recompute", "only recompute preemption is implemented"
