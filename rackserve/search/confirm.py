"""Confirm screened points by replay: each (configuration, lanes) is one discrete-event run of the
rack's workload over the search's window, run as a Ray task (a local Ray instance by default, a Ray
cluster when given its address). Results come back as they finish, so a long search can be
interrupted and resumed without losing the points already run.

Ray is imported only inside `RayPool` (the search's process boundary); the runs are the pure simulator.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Iterator, Sequence

from rackserve.search.plan import Candidate
from rackserve.search.rack import Config, RackSpec, scenario_of
from rackserve.sim.run import keep_steps, shared_timing, simulate
from rackserve.sim.validity import Validity, coverage_at_window

RAY_ENV = {  # local, loopback-only, offline Ray (ENVIRONMENT.md)
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
}
INTERACTIVITY_KEYS = ("tps_user_e2e_p50", "tps_user_e2e_p90", "tps_user_itl_p50", "tps_user_itl_p90")
RESULT_KEYS = ("throughput_per_gpu", "output_tps_per_gpu", *INTERACTIVITY_KEYS, "ttft_p50_s", "ttft_p90_s",
               "tpot_p50_s", "tpot_p90_s", "hit_rate", "completed", "arrivals", "prefill_idle_frac",
               "decode_idle_frac", "cpu_s", "wall_s", "valid", "invalid_reasons", "metric_coverage",
               "overflow_share", "rejected")


def replay_point(rack: dict, config: dict, concurrency: int, window_s: float | None = None) -> dict:
    """One discrete-event run (inside a Ray task or in-process): the figures a frontier point keeps."""
    spec = RackSpec.model_validate(rack)
    nominal = spec.search.window_s
    if window_s:
        spec = spec.model_copy(update={"search": spec.search.model_copy(update={"window_s": window_s})})
    cfg = Config.from_dict(config)
    start = time.process_time()
    scenario = scenario_of(spec, cfg, concurrency)
    # the worker's step-cost memo for this timing section: replays after the first on a worker
    # find the steps earlier ones priced (the same figures, sooner; rackserve.sim.run.shared_timing)
    timing = shared_timing(scenario)
    res = simulate(scenario, policy=cfg.policy, timing=timing).to_dict()
    keep_steps(scenario, timing)  # for later replays in other processes, where a step store is configured
    row = {k: res.get(k) for k in RESULT_KEYS}
    if spec.search.window_s < nominal:  # a cut window: validity as the rack's window would judge it
        cov = coverage_at_window(res["completed"], res["rejected"], res["metric_coverage"],
                                 spec.search.window_s, nominal)
        judged = Validity(res["overflow_share"], cov)
        row |= {"metric_coverage": cov, "metric_coverage_measured": res["metric_coverage"],
                "valid": judged.valid, "invalid_reasons": judged.reasons}
    row["cpu_s"] = time.process_time() - start
    row["max_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    return {"config": config, "concurrency": int(concurrency), "source": "replay",
            "window_s": spec.search.window_s, **row}


class InProcess:
    """Runs candidates one after another in this process (tests, a single point)."""

    def run(self, rack: dict, cands: Sequence[Candidate]) -> Iterator[dict]:
        for c in cands:
            yield replay_point(rack, c.config, c.concurrency, c.window_s)

    def close(self) -> None:
        pass


class RayPool:
    """Candidates as Ray tasks of one CPU each; results in the order they finish."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        for key, value in RAY_ENV.items():
            os.environ.setdefault(key, value)
        import ray  # the search's process boundary: the core simulator stays free of Ray

        self._ray = ray
        if address:
            ray.init(address=address, log_to_driver=False)
        else:  # address="local": always our own instance, never another process's cluster
            ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False,
                     log_to_driver=False)
        self._task = ray.remote(num_cpus=1)(replay_point)

    def run(self, rack: dict, cands: Sequence[Candidate]) -> Iterator[dict]:
        ray = self._ray
        ref = ray.put(rack)
        pending = [self._task.remote(ref, c.config, c.concurrency, c.window_s) for c in cands]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield ray.get(done[0])

    def close(self) -> None:
        self._ray.shutdown()


Runner = InProcess | RayPool
OnPoint = Callable[[dict], None]
