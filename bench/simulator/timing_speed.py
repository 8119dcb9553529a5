"""How fast is one step_time call? The simulator calls it millions of times (goal: <= 20 us for a
typical decode batch).

    .venv/bin/python bench/simulator/timing_speed.py [OUT.json]   (default bench/results/simulator/timing_speed.json)

Per case: a pool of pre-built batches (fresh context lengths each, so nothing is reused by object),
cycled through; the median (and best) of 7 repeats of CPU time per call (the host is shared, so wall
time is noisy; the load average is recorded, and so is `numpy_unit_us`, the CPU time of one tiny
np.add on the same host at the same time, to compare runs taken under different load).
"memo miss" cases give every call sequence counts per rank not seen before (a fresh TimingModel
per repeat), so the token-count components are recomputed; the others hit that memo, as a long
simulation mostly does. "reference" rows time TimingModel.step_time_reference, the readable path
the fast one is tested against. Writes bench/results/simulator/timing_speed.json.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rackserve.timing import RankBatch, StepBatch, TimingModel  # noqa: E402

GOAL_US = 20.0


def decode_pool(dp: int, seqs: int, n: int, rng, vary_seqs: bool = False) -> list[StepBatch]:
    pool = []
    for _ in range(n):
        ranks = []
        for _r in range(dp):
            k = int(rng.integers(1, 2 * seqs)) if vary_seqs else seqs
            ranks.append(RankBatch(np.ones(k, dtype=np.int64), rng.integers(1000, 65536, k)))
        pool.append(StepBatch(tuple(ranks)))
    return pool


def per_call_us(fn, pool: list, repeats: int = 7, rounds: int = 4) -> tuple[float, float]:
    """(median, best) CPU microseconds per call over `repeats` passes of `rounds` x pool."""
    for b in pool:  # warm (the memo of token-count components fills here, as in a long simulation)
        fn(b)
    runs = []
    for _ in range(repeats):
        t = time.process_time()
        for _ in range(rounds):
            for b in pool:
                fn(b)
        runs.append((time.process_time() - t) / (rounds * len(pool)) * 1e6)
    return statistics.median(runs), min(runs)


def per_call_cold_us(make_fn, pool: list, repeats: int = 7) -> tuple[float, float]:
    """Like per_call_us, each repeat with a fresh model (make_fn()) so no call hits a memo."""
    runs = []
    for _ in range(repeats):
        fn = make_fn()
        fn(pool[0])  # per-layout constants are built here, outside the timed loop
        t = time.process_time()
        for b in pool[1:]:
            fn(b)
        runs.append((time.process_time() - t) / (len(pool) - 1) * 1e6)
    return statistics.median(runs), min(runs)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def numpy_unit_us(n: int = 200_000) -> float:
    """CPU time of one np.add of two 8-element arrays: this host's per-numpy-call cost right now."""
    a = np.arange(8.0)
    t = time.process_time()
    for _ in range(n):
        np.add(a, a)
    return (time.process_time() - t) / n * 1e6


def main() -> None:
    rng = np.random.default_rng(0)
    load_before = os.getloadavg()
    unit_before = numpy_unit_us()

    def make() -> TimingModel:
        return TimingModel.create("vr200", "deepseek-v4.1-flash", "rubin-optimized")

    tm = make()
    wide8, wide72, tp8, dep2 = (
        tm.layout("wide-ep", 8),
        tm.layout("wide-ep", 72),
        tm.layout("tp8"),
        tm.layout("dep2"),
    )
    prefill = [
        StepBatch((RankBatch.of([int(n)], [int(c)]), RankBatch.of([int(n2)], [0])))
        for n, c, n2 in rng.integers(64, 8192, (50, 3))
    ]
    typical = decode_pool(8, 32, 50, rng)
    cases = [
        (
            "decode wide-ep8, 32 seqs/rank (typical)",
            lambda b: tm.step_time("decode", wide8, b),
            typical,
        ),
        (
            "decode wide-ep8, 32 seqs/rank (typical), reference",
            lambda b: tm.step_time_reference("decode", wide8, b),
            typical,
        ),
        (
            "decode wide-ep8, 1..63 seqs/rank varying",
            lambda b: tm.step_time("decode", wide8, b),
            decode_pool(8, 32, 50, rng, True),
        ),
        (
            "decode tp8, 16 seqs",
            lambda b: tm.step_time("decode", tp8, b),
            decode_pool(1, 16, 50, rng),
        ),
        (
            "decode wide-ep72, 64 seqs/rank",
            lambda b: tm.step_time("decode", wide72, b),
            decode_pool(72, 64, 20, rng),
        ),
        ("prefill dep2, 1 prompt/rank", lambda b: tm.step_time("prefill", dep2, b), prefill),
        (
            "prefill dep2, 1 prompt/rank, reference",
            lambda b: tm.step_time_reference("prefill", dep2, b),
            prefill,
        ),
        (
            "prefill_estimate_s dep2",
            lambda b: tm.prefill_estimate_s(dep2, int(b.ranks[0].new_tokens[0]), 0),
            prefill,
        ),
    ]
    rows = []
    print(f"{'case':52} {'median us':>10} {'best us':>9}")
    for name, fn, pool in cases:
        med, best = per_call_us(fn, pool)
        rows.append({"case": name, "us_per_call": med, "best_us": best})
        print(f"{name:52} {med:10.1f} {best:9.1f}")
    cold = decode_pool(8, 32, 201, rng, True)
    for name, ref in (("memo miss", False), ("memo miss, reference", True)):

        def make_fn(ref=ref):
            t = make()
            lay = t.layout("wide-ep", 8)
            step = t.step_time_reference if ref else t.step_time
            return lambda b: step("decode", lay, b)

        med, best = per_call_cold_us(make_fn, cold)
        label = f"decode wide-ep8, 1..63 seqs/rank, {name}"
        rows.append({"case": label, "us_per_call": med, "best_us": best})
        print(f"{label:52} {med:10.1f} {best:9.1f}")
    typical_us = rows[0]["us_per_call"]
    unit_after = numpy_unit_us()
    print(
        f"goal <= {GOAL_US} us for the typical decode batch: "
        f"{'met' if typical_us <= GOAL_US else 'NOT met'} ({typical_us:.1f} us median); "
        f"numpy unit {unit_before:.2f}/{unit_after:.2f} us, load {load_before[0]:.1f}/{os.getloadavg()[0]:.1f}"
    )
    out = {
        "command": ".venv/bin/python bench/simulator/timing_speed.py",
        "timer": "time.process_time per call: median (us_per_call) and best of 7 repeats",
        "load_average_1_5_15_before": load_before,
        "load_average_1_5_15_after": os.getloadavg(),
        "numpy_unit_us_before_after": [unit_before, unit_after],
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "goal_us": GOAL_US,
        "goal_met": typical_us <= GOAL_US,
        "rows": rows,
    }
    default = ROOT / "bench" / "results" / "simulator" / "timing_speed.json"
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else default
    target.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
