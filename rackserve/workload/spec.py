"""The scenario file's `workload` section: a validated pydantic model per workload kind.

`parse_workload(dict)` raises ValueError naming the bad field (e.g. "workload.concurrency: ...").
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from rackserve.workload.lanes import check_lanes_schedule

DEFAULT_AGENTX_TRACE = str(Path(__file__).resolve().parents[2] / "data/agentx/claude_code_traces_dev.jsonl.gz")
DEEPSEEK_V4_MAX_CONTEXT = 1_048_576  # DeepSeek-V4 family: 1M-token context (DeepSeek V4 model card)


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MooncakeWorkload(_Spec):
    """Replay a Mooncake JSONL trace (open loop: arrivals at the trace's timestamps)."""

    kind: Literal["mooncake"]
    trace: str = Field(description="path to the JSONL trace")
    limit: int | None = Field(None, gt=0, description="use only the first N records")
    time_scale: float = Field(1.0, gt=0, description="multiplies inter-arrival times")


class AgentXWorkload(_Spec):
    """AgentX-like agentic sessions: `concurrency` lanes, each running multi-turn sessions back to back."""

    kind: Literal["agentx"]
    seed: int = 0
    concurrency: int = Field(gt=0, description="live session lanes")
    sessions: int = Field(gt=0, description="sessions to run in total (lanes pick the next when one ends)")
    duration_s: float | None = Field(None, gt=0, description="no new turn starts after this simulated time")
    start_stagger_s: float = Field(10.0, ge=0, description="lanes start uniformly over this window")
    system_prompt_tokens: int = Field(6000, ge=0)
    tool_defs_tokens: int = Field(4000, ge=0)
    system_prompt_variants: int = Field(1, gt=0, description="distinct system prompts across sessions")
    first_user_tokens: int = Field(800, gt=0)
    turns_min: int = Field(8, gt=0)
    turns_max: int = Field(30, gt=0)
    tool_output_tokens_min: int = Field(100, gt=0)
    tool_output_tokens_max: int = Field(3000, gt=0)
    output_tokens: int = Field(400, gt=0, description="fixed output length of every turn")
    think_time_mean_s: float = Field(2.0, ge=0, description="exponential think time between turns")
    subagent_probability: float = Field(0.1, ge=0, le=1, description="chance a turn spawns a subagent")
    subagent_turns_min: int = Field(2, gt=0)
    subagent_turns_max: int = Field(6, gt=0)
    subagent_task_tokens: int = Field(300, gt=0)

    @model_validator(mode="after")
    def _ranges(self) -> AgentXWorkload:
        for lo, hi in (("turns_min", "turns_max"), ("tool_output_tokens_min", "tool_output_tokens_max"),
                       ("subagent_turns_min", "subagent_turns_max")):
            if getattr(self, lo) > getattr(self, hi):
                raise ValueError(f"{lo} must be <= {hi}")
        return self


class AgentXTraceWorkload(_Spec):
    """Recorded agentic conversations replayed by the AgentX rules (data/agentx/README.md):
    `concurrency` lanes, initial lanes start at t* ~ U(start_ratio_min, start_ratio_max) of their
    conversation after one warm-up turn, recycled lanes start at turn 0."""

    kind: Literal["agentx-trace"]
    trace: str = Field(DEFAULT_AGENTX_TRACE, description="conversation JSONL (.gz allowed)")
    limit: int | None = Field(None, gt=0, description="use only the first N conversations")
    seed: int = 0
    concurrency: int = Field(gt=0, description="live lanes, each replaying one conversation tree")
    max_context: int = Field(
        DEEPSEEK_V4_MAX_CONTEXT, gt=0, description="model context; a longer prompt + output overflows")
    think_time_cap_s: float = Field(10.0, ge=0, description="recorded idle gaps end-to-start, capped (AgentX: 10 s)")
    start_ratio_min: float = Field(0.25, ge=0, le=1, description="initial lanes' t* range, share of duration")
    start_ratio_max: float = Field(0.75, ge=0, le=1)
    start_stagger_s: float = Field(0.0, ge=0, description="lanes' first requests spread over this window")
    warmup_first: bool = Field(
        False, description="AgentX order: every lane's warm-up turn finishes before any lane goes on; "
        "duration_s and the measured window then count from that moment (TraceReplaySource.released_at_s)")
    length_scale: float = Field(1.0, gt=0, le=1, description="scale every length (a small live model)")
    duration_s: float = Field(960.0, gt=0, description="no request is sent at or after this simulated time")
    measure_start_s: float = Field(
        60.0, ge=0, description="measured window start: requests finishing from here count (warm-ups never)")
    measure_s: float | None = Field(None, gt=0, description="measured window length (None: to duration_s)")
    lanes_schedule: tuple[tuple[float, int], ...] | None = Field(
        None, description="[[t_s, lanes], ...] (issue 52: sessions in waves): lane i starts conversations while "
        "the schedule runs more than i lanes; a conversation under way runs to its end, and the lane's next one "
        "waits for the schedule to reach it again; lanes open at t_s 0 start as `concurrency` lanes do, the "
        "others at turn 0 when opened; replaces `concurrency` (set to the most lanes)")

    @model_validator(mode="before")
    @classmethod
    def _lanes(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("lanes_schedule"):
            sched = check_lanes_schedule(tuple(tuple(x) for x in data["lanes_schedule"]))
            data = {**data, "concurrency": max(n for _, n in sched)}
        return data

    @field_validator("lanes_schedule")
    @classmethod
    def _schedule(cls, sched: tuple[tuple[float, int], ...] | None) -> tuple[tuple[float, int], ...] | None:
        return check_lanes_schedule(sched)

    @model_validator(mode="after")
    def _ranges(self) -> AgentXTraceWorkload:
        if self.lanes_schedule is not None and self.warmup_first:
            raise ValueError("lanes_schedule and warmup_first cannot both be set (lanes opened later have no warm-up)")
        if self.start_ratio_min > self.start_ratio_max:
            raise ValueError("start_ratio_min must be <= start_ratio_max")
        if self.measure_start_s >= self.duration_s:
            raise ValueError("measure_start_s must be < duration_s")
        return self

    @property
    def measure_window(self) -> tuple[float, float]:
        """(start, end) in simulated seconds of the measured window. One rule (rackserve.sim.metrics):
        the figures count the requests that finish successfully inside it, as AgentX counts the
        successful requests of its profiling window; warm-ups never count."""
        start = min(self.measure_start_s, self.duration_s)  # a --duration override may cut it
        end = self.duration_s if self.measure_s is None else start + self.measure_s
        return start, min(end, self.duration_s)


class UniformWorkload(_Spec):
    """Closed loop of identical-shape requests (e.g. batch-1 latency): `concurrency` lanes."""

    kind: Literal["uniform"]
    seed: int = 0
    concurrency: int = Field(1, gt=0)
    requests: int = Field(gt=0)
    prompt_tokens: int = Field(gt=0)
    output_tokens: int = Field(gt=0)
    shared_prefix_tokens: int = Field(0, ge=0, description="prefix common to every prompt")
    length_spread: float = Field(
        0.0, ge=0, lt=1, description="draw each prompt / output length uniformly in [(1 - s) L, L] "
        "(InferenceX: 0.2, i.e. 80-100% of ISL and OSL)")
    lanes_schedule: tuple[tuple[float, int], ...] | None = Field(
        None, description="[[t_s, lanes], ...] from t_s on, `lanes` lanes run (a step function; a ramp is "
        "many steps): the first at t_s 0, times increasing; replaces `concurrency`")

    @field_validator("lanes_schedule")
    @classmethod
    def _schedule(cls, sched: tuple[tuple[float, int], ...] | None) -> tuple[tuple[float, int], ...] | None:
        return check_lanes_schedule(sched)


AnyWorkload = MooncakeWorkload | AgentXWorkload | AgentXTraceWorkload | UniformWorkload
WorkloadSpec = Annotated[AnyWorkload, Field(discriminator="kind")]
_ADAPTER: TypeAdapter[Any] = TypeAdapter(WorkloadSpec)


def parse_workload(data: dict[str, Any]) -> AnyWorkload:
    """Validate a scenario's workload dict; ValueError names the field ("workload.<field>: ...")."""
    if not isinstance(data, dict) or "kind" not in data:
        raise ValueError("workload.kind: required (one of mooncake, agentx, agentx-trace, uniform)")
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = [str(p) for p in err["loc"][1:]]  # drop the union tag
            if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
                loc = ["kind"]
            problems.append(f"workload{'.' + '.'.join(loc) if loc else ''}: {err['msg']}")
        raise ValueError("; ".join(problems)) from None
