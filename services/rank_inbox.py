"""What rides on a rank's step call: the admissions submitted since its last step.

A request is admitted by the step call that first computes it: the instance loop hands each rank
the submissions queued for it (`Submission`), the actor applies them in order, then steps, and
answers each one (`AdmitResult`) with the step. A request so costs no Ray call of its own: the
prefill and the decode admission each rode a separate actor call (~3.5-7 ms each on 2 loaded
cores, bench/notes/frontdoor_stages.md) before the step call that computed the request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ADMIT_OK = ""
QUEUE_FULL = "queue_full"  # rackserve.sched.QueueFull: the rank's queue is full (429 upstream)
INVALID = "invalid"  # ValueError: bad input, named (INVALID_ARGUMENT upstream)
FAILED = "failed"  # anything else went wrong admitting it (the router re-routes)


@dataclass(frozen=True)
class Admitted:
    """What admission found: prompt tokens reused from HBM and from each pool tier."""

    local_hit_tokens: int
    pool_hbm_tokens: int
    pool_dram_tokens: int


@dataclass(frozen=True)
class Submission:
    """One admission for a rank, applied before its next step."""

    kind: str  # "prefill" | "decode"
    request_id: str
    prompt: tuple[int, ...] = ()
    params: dict = field(default_factory=dict)  # the wire SamplingParams as plain fields
    first_token: int = 0  # decode: the prefill's token
    kv_hashes: tuple[int, ...] = ()  # decode: the KV handle's block hashes
    kv_lease_id: int = 0  # decode: the prefill's lease over them (0 = none)
    kv_tiers: tuple[str, ...] = ()  # decode: each block's pool tier as leased (empty: ask the pool)


@dataclass(frozen=True)
class AdmitResult:
    """The answer to one submission: what admission found, or why it was refused."""

    request_id: str
    admitted: Admitted | None
    status: str = ADMIT_OK  # ADMIT_OK, QUEUE_FULL, INVALID or FAILED
    error: str = ""
