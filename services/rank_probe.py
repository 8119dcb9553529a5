"""Active health probe of a worker's rank actors, answered in the service's Health RPC.

Every rank actor is asked a trivial question (`ready`) with a short deadline; a rank that does not
answer in time (its process is stopped or swapped out, its actor died and is restarting) is
reported as unresponsive, and the router keeps it out of routing until a later probe succeeds.
"""

from __future__ import annotations

import asyncio

PROBE_TIMEOUT_S = 2.0  # the Health RPC's callers allow more than this


async def unresponsive(actors: dict[str, list], timeout_s: float = PROBE_TIMEOUT_S) -> list[str]:
    """ "instance/rank" of every rank actor that did not answer `ready` within `timeout_s`."""
    keys = [(name, r) for name, ranks in actors.items() for r in range(len(ranks))]
    answers = await asyncio.gather(*(_answers(actors[n][r], timeout_s) for n, r in keys))
    return [f"{n}/{r}" for (n, r), ok in zip(keys, answers, strict=True) if not ok]


async def _answers(actor, timeout_s: float) -> bool:
    try:
        return bool(await asyncio.wait_for(_ready(actor), timeout_s))
    except Exception:  # died, restarting or too slow: all mean "do not route here now"
        return False


async def _ready(actor) -> bool:
    return await actor.ready.remote()
