"""The request message every workload produces and the simulator / live router consume."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Request:
    """One inference request.

    block_hashes: chained hashes of the prompt's full blocks at the target's block size
    (rackserve.kv.block_hash spec), so equal prefixes share ids across requests.
    session / turn: which agentic session and turn produced it (-1 / 0 for trace requests).
    lane: the closed-loop lane that sent it (-1: none). warmup: a cache warm-up request that the
    figures leave out (AgentX). block_hash_array: block_hashes as a uint64 array when the workload
    has it at hand (trace replay), for vectorized consumers; None otherwise.
    """

    req_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...]
    session: int = -1
    turn: int = 0
    lane: int = -1
    warmup: bool = False
    block_hash_array: np.ndarray | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        assert self.prompt_tokens > 0 and self.output_tokens > 0
        assert self.arrival_s >= 0.0
