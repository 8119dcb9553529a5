"""What a candidate instance count gives at a forecast load, priced by the cost model (the
TimingModel the simulator and the router price with): TTFT from the prefill engine step of the mean
prompt with M/D/1 queueing per prefill rank, ITL from the decode step at the batch Little's law
gives. The sla policy asks it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rackserve.timing.batch import RankBatch, StepBatch

INF = math.inf
LITTLE_ROUNDS = 4  # fixed-point rounds of seqs = rate x output x ITL(seqs)


@dataclass(frozen=True)
class RoleShape:
    """One instance of a role as the forecast prices it."""

    layout_name: str  # RankState.layout (the router's prefill key)
    layout: Any  # the timing model's layout object
    ranks: int  # DP ranks
    gpus: int
    max_seqs: int = 0  # decode: sequences a rank may run
    kv_tokens: int = 0  # decode: KV tokens a rank may hold
    chunk_tokens: int = 8192  # prefill: tokens a rank computes per step (max_num_batched_tokens)


class CostForecast:
    def __init__(self, timing: Any, prefill: RoleShape, decode: RoleShape, headroom: float) -> None:
        self.timing = timing
        self.prefill, self.decode = prefill, decode
        self.headroom = headroom  # highest rank utilisation planned for (queueing diverges at 1)
        self._itl: dict[tuple[int, int], float] = {}
        self._service: dict[int, float] = {}

    def service_s(self, prompt_tokens: int) -> float:
        """Seconds a prefill rank spends on one prompt: the engine steps that compute it (chunks of
        chunk_tokens, no cache hit: conservative), every rank of the lockstep instance with one."""
        p = self.prefill
        if prompt_tokens not in self._service:
            full, rest = divmod(prompt_tokens, p.chunk_tokens)
            total = 0.0
            for tokens, n in ((p.chunk_tokens, full), (rest, 1)):
                if n and tokens:
                    rank = RankBatch.of([tokens])
                    total += n * self.timing.step_time("prefill", p.layout, StepBatch((rank,) * p.ranks)).total_s
            self._service[prompt_tokens] = total
        return self._service[prompt_tokens]

    def ttft_s(self, instances: int, rate: float, prompt_tokens: float, backlog_tokens: float) -> float:
        """Mean TTFT with `instances` prefill instances at `rate` requests/s: the prompt's compute
        (service_s), the M/D/1 wait of a rank at that utilisation (Kleinrock, Queueing Systems
        vol. 1, eq. 5.73: W = rho S / (2 (1 - rho))), and the queued prompt tokens `backlog_tokens`
        shared over the ranks at the same speed."""
        if prompt_tokens <= 0:
            return 0.0
        ranks = instances * self.prefill.ranks
        service = self.service_s(int(prompt_tokens))
        rho = rate * service / ranks
        if rho >= self.headroom:
            return INF
        backlog_s = backlog_tokens / prompt_tokens * service / ranks
        return service + rho * service / (2 * (1 - rho)) + backlog_s

    def itl_s(self, instances: int, rate: float, output_tokens: float, context_tokens: float,
              running_seqs: int) -> float:
        """ITL with `instances` decode instances: the decode step at the batch the load keeps
        running (the larger of the sequences running now and Little's law: rate x output tokens x
        ITL, solved by fixed point); INF where a rank cannot hold that batch (seqs or KV)."""
        ranks = instances * self.decode.ranks
        seqs = max(running_seqs, 1)
        itl = self._step_s(math.ceil(seqs / ranks), context_tokens)
        for _ in range(LITTLE_ROUNDS):
            if itl == INF:  # the running sequences alone do not fit
                return INF
            little = rate * output_tokens * itl
            seqs = max(running_seqs, math.ceil(little), 1)
            itl = self._step_s(math.ceil(seqs / ranks), context_tokens)
            if itl == INF:
                return INF
        return itl

    def _step_s(self, per_rank: int, context_tokens: float) -> float:
        ctx = max(1, int(context_tokens))
        d = self.decode
        if per_rank > d.max_seqs or per_rank * ctx > d.kv_tokens:
            return INF
        key = (per_rank, ctx)
        if key not in self._itl:
            rank = RankBatch.of([1] * per_rank, [ctx] * per_rank)
            batch = StepBatch(tuple(rank for _ in range(d.ranks)))
            self._itl[key] = self.timing.decode_token_time(d.layout, batch).total_s
        return self._itl[key]
