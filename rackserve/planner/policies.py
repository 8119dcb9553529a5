"""The planner policies: `fixed` (never changes), `load` (Dynamo's load-based planner) and `sla`
(predictive, on the cost model). Each is a small class with `decide(obs, current) -> Targets`."""

from __future__ import annotations

import itertools
import math
from typing import Any

from rackserve.planner.observation import Targets, TickObs
from rackserve.planner.policy import Bounds, Planner


class FixedPlanner:
    def __init__(self, settings: Any, bounds: Bounds, context: dict[str, Any]) -> None:
        pass

    def decide(self, obs: TickObs, current: Targets) -> Targets:
        return current


class LoadPlanner:
    """Dynamo's load-based planner (docs.nvidia.com/dynamo, architecture/planner "Load-based Scaling
    Up/Down Prefill/Decode Workers"): prefill scales on its queue, decode on its average KV cache
    utilisation, each compared with an up and a down threshold every adjustment interval; one
    worker more or less per interval ("to avoid over-compensation"), and no decision while workers
    are being adjusted (here: while one is starting). The queue is measured as queued prefill
    tokens per active prefill instance in engine steps (tokens / its ranks' step budget)."""

    def __init__(self, settings: Any, bounds: Bounds, context: dict[str, Any]) -> None:
        self.s, self.bounds = settings, bounds
        self.step_tokens = context["prefill_step_tokens"]  # per instance: ranks x max_num_batched_tokens

    def decide(self, obs: TickObs, current: Targets) -> Targets:
        if any(i.state == "starting" for i in obs.instances):
            return current
        prefill = obs.of("prefill", "active")
        decode = obs.of("decode", "active")
        queue = sum(i.queued_prefill_tokens for i in prefill) / max(len(prefill), 1) / self.step_tokens
        kv = sum(i.kv_used for i in decode) / max(len(decode), 1)
        p = current.prefill + (queue > self.s.queue_up) - (queue < self.s.queue_down)
        d = current.decode + (kv > self.s.kv_up) - (kv < self.s.kv_down)
        return self.bounds.clamp(Targets(p, d), current)


class SlaPlanner:
    """Predictive, as Dynamo's SLA planner (docs.nvidia.com/dynamo planner "SLA-based scaling":
    forecast the next interval's load, then pick the replicas whose predicted TTFT / ITL meet the
    targets), with the forecast priced by rackserve's cost model instead of profiled interpolation:
    the load is the last tick's (Dynamo's `constant` load predictor), every (prefill, decode) count
    within the bounds is priced (rackserve.planner.forecast.CostForecast) and the fewest GPUs that
    meet both targets win; when none does, the one closest to them (worst ratio to its target).
    As Dynamo's SLA planner, predictions are scaled by correction factors (docs.nvidia.com/dynamo
    design-docs/planner-design, "Step 2: Correction Factor Calculation": prefill_correction =
    actual_ttft / expected_ttft, decode_correction = actual_itl / expected_itl), here the last
    tick's observed mean over the prediction at the counts that served it (queueing and prefix
    hits the forecast leaves out), kept from the tick before when those counts changed during it
    (its requests then saw other counts than the ones priced)."""

    def __init__(self, settings: Any, bounds: Bounds, context: dict[str, Any]) -> None:
        self.s, self.bounds = settings, bounds
        self.forecast = context["forecast"]
        self._served: tuple[int, int] | None = None  # routable counts at the last decision
        self._corrections = (1.0, 1.0)

    def decide(self, obs: TickObs, current: Targets) -> Targets:
        if obs.arrivals == 0 and not any(i.running_seqs or i.queued_prefill_tokens for i in obs.instances):
            return self.bounds.clamp(Targets(self.bounds.min_prefill, self.bounds.min_decode), current)
        b, f = self.bounds, self.forecast
        rate = obs.arrival_rate
        backlog = sum(i.queued_prefill_tokens for i in obs.of("prefill"))
        running = sum(i.running_seqs for i in obs.of("decode"))
        context = obs.mean_prompt_tokens + obs.mean_output_tokens / 2
        ttft = {p: f.ttft_s(p, rate, obs.mean_prompt_tokens, backlog) for p in range(b.min_prefill, b.max_prefill + 1)}
        itl = {d: f.itl_s(d, rate, obs.mean_output_tokens, context, running)
               for d in range(b.min_decode, b.max_decode + 1)}
        served_p = len(obs.of("prefill", "active", "draining"))
        served_d = len(obs.of("decode", "active", "draining"))
        if self._served in (None, (served_p, served_d)):
            self._corrections = (_correction(obs.ttft_s, ttft.get(served_p)), _correction(obs.itl_s, itl.get(served_d)))
        self._served = (served_p, served_d)
        c_ttft, c_itl = self._corrections
        ttft = {p: v * c_ttft for p, v in ttft.items()}
        itl = {d: v * c_itl for d, v in itl.items()}
        best: tuple | None = None
        for p, d in itertools.product(ttft, itl):
            t = Targets(p, d)
            if b.gpus(t) > b.gpu_budget:
                continue
            worst = max(ttft[p] / self.s.ttft_target_s, itl[d] / self.s.itl_target_s)
            # feasible first, by fewest GPUs; else the closest to the targets, then the most GPUs
            key = (worst > 1.0, b.gpus(t) if worst <= 1.0 else 0, worst, -b.gpus(t))
            if best is None or key < best[0]:
                best = (key, t)
        return current if best is None else best[1]


def _correction(observed: tuple[float, ...], predicted: float | None) -> float:
    """Observed mean / predicted (1 without samples or a finite prediction)."""
    if not observed or predicted is None or not 0 < predicted < math.inf:
        return 1.0
    return sum(observed) / len(observed) / predicted


PLANNERS: dict[str, type] = {"fixed": FixedPlanner, "load": LoadPlanner, "sla": SlaPlanner}


def make_planner(name: str, settings: Any, bounds: Bounds, context: dict[str, Any]) -> Planner:
    """The policy `name` with the scenario's settings; `context`: what a policy needs of the
    deployment (load: prefill_step_tokens per instance; sla: a CostForecast)."""
    if name not in PLANNERS:
        raise ValueError(f"planner.policy: {name!r} is not one of {sorted(PLANNERS)}")
    return PLANNERS[name](settings, bounds, context)
