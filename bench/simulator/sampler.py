"""A statistical CPU profiler for the simulator, from the standard library: SIGPROF every `interval_s` of
the process's CPU time, each sample charged to the innermost frame of this repository's code (its
callees in numpy or the interpreter count with it). Unlike cProfile it adds no cost per call, so the
shares of a run of many small calls stay as they are unprofiled (~1% overhead at 100 Hz).

    with Sampler() as s:
        ...
    s.report()  # {"samples", "interval_s", "parts": {part: share}, "lines": [[file:line function, share], ...]}

Parts are this repository's modules grouped by what they do (PARTS); bench/simulator/frontier_point.py writes the report.
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])

# (part, path prefixes under the repository): the first whose prefix the sample's innermost own frame has
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("timing model: pricing a step (memo misses, router tables)", ("rackserve/timing/",)),
    ("step-cost memo: lookups", ("rackserve/sim/step_cache.py",)),
    ("KV pool: chains, tiers, puts (kv/pool_*)", ("rackserve/kv/",)),
    ("KV: rank caches, pool paths, block keys (sim/kv.py)", ("rackserve/sim/kv.py", "rackserve/sim/block_keys.py",
                                                             "rackserve/sim/pool_paths.py")),
    ("routing: prefix match, least-uncached-work, regret", ("rackserve/routing/", "rackserve/sim/live_view.py")),
    ("schedulers: prefill ranks, decode batches (sched/)", ("rackserve/sched/",)),
    ("decode side: leaps, tail steps (sim/decode_side.py)", ("rackserve/sim/decode_side.py",
                                                            "rackserve/sim/instances.py")),
    ("trace source: conversations, turns, block hashes", ("rackserve/workload/",)),
    ("metrics and result", ("rackserve/sim/metrics.py", "rackserve/sim/result.py", "rackserve/sim/decode_load.py",
                            "rackserve/metrics/")),
    ("event loop and handlers (sim/simulator.py, events.py)", ("rackserve/sim/",)),
)
OTHER = "other (start-up, interpreter, outside rackserve/)"


class Sampler:
    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self.lines: Counter[tuple[str, int, str]] = Counter()
        self.samples = 0
        self._old = None

    def _tick(self, signum, frame) -> None:
        self.samples += 1
        f = frame
        while f is not None:
            path = f.f_code.co_filename
            if path.startswith(ROOT) and "/bench/" not in path and "/.venv" not in path:
                self.lines[(path[len(ROOT) + 1:], f.f_lineno, f.f_code.co_name)] += 1
                return
            f = f.f_back
        self.lines[("", 0, "")] += 1

    def __enter__(self) -> Sampler:
        self._old = signal.signal(signal.SIGPROF, self._tick)
        signal.setitimer(signal.ITIMER_PROF, self.interval_s, self.interval_s)
        return self

    def __exit__(self, *exc) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0.0, 0.0)
        signal.signal(signal.SIGPROF, self._old or signal.SIG_DFL)

    def report(self, top: int = 25) -> dict:
        n = max(self.samples, 1)
        parts: Counter[str] = Counter()
        for (path, _, _), k in self.lines.items():
            parts[part_of(path)] += k
        lines = [[f"{path}:{line} {fn}", round(k / n, 4)] for (path, line, fn), k in self.lines.most_common(top)
                 if path]
        return {"samples": self.samples, "interval_s": self.interval_s,
                "parts": {p: round(k / n, 4) for p, k in parts.most_common()}, "lines": lines}


def part_of(path: str) -> str:
    for part, prefixes in PARTS:
        if path.startswith(prefixes):
            return part
    return OTHER
