"""The request message every workload produces and the simulator / live router consume."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    """One inference request.

    block_hashes: chained hashes of the prompt's full blocks at the target's block size
    (rackserve.kv.block_hash spec), so equal prefixes share ids across requests.
    session / turn: which agentic session and turn produced it (-1 / 0 for trace requests).
    """

    req_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...]
    session: int = -1
    turn: int = 0

    def __post_init__(self) -> None:
        assert self.prompt_tokens > 0 and self.output_tokens > 0
        assert self.arrival_s >= 0.0
