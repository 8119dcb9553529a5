"""What the planner reads each tick and what it decides: plain frozen dataclasses."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceObs:
    """One routable (or starting / draining) instance at the tick: its queue and KV use averaged over
    the tick's samples (as Dynamo aggregates its metric pulls over an adjustment interval), its
    running sequences as they are now."""

    name: str
    role: str  # "prefill" | "decode"
    state: str  # "starting" | "active" | "draining"
    gpus: int
    queued_prefill_tokens: int = 0  # prefill: uncached prompt tokens waiting or running
    queued_prefill_s: float = 0.0  # prefill: the router's estimate of that work (seconds, summed over ranks)
    running_seqs: int = 0  # decode: sequences routed to it and not finished
    kv_used: float = 0.0  # decode: share of its KV blocks held (0..1)


@dataclass(frozen=True)
class TickObs:
    """The last tick: arrivals (count, mean prompt and output tokens), the TTFT / ITL of requests
    that finished in it, and every instance holding GPUs."""

    now_s: float
    tick_s: float
    arrivals: int
    mean_prompt_tokens: float
    mean_output_tokens: float
    ttft_s: tuple[float, ...]
    itl_s: tuple[float, ...]
    instances: tuple[InstanceObs, ...]

    @property
    def arrival_rate(self) -> float:
        return self.arrivals / self.tick_s

    def of(self, role: str, *states: str) -> list[InstanceObs]:
        return [i for i in self.instances if i.role == role and (not states or i.state in states)]


@dataclass(frozen=True)
class Targets:
    prefill: int
    decode: int
