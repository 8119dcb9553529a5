"""How fast is one step_time call? The simulator calls it millions of times (goal: <= 20 us for a
typical decode batch).

    .venv/bin/python bench/timing_speed.py

Per case: a pool of pre-built batches (fresh context lengths each, so nothing is reused by object),
cycled through; the best of 7 repeats of CPU time per call (the host is shared, so wall time is
noisy; the load average is recorded). Writes bench/results/timing_speed.json.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
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


def per_call_us(fn, pool: list, repeats: int = 7, rounds: int = 4) -> float:
    for b in pool:  # warm (the memo of token-count components fills here, as in a long simulation)
        fn(b)
    best = float("inf")
    for _ in range(repeats):
        t = time.process_time()
        for _ in range(rounds):
            for b in pool:
                fn(b)
        best = min(best, (time.process_time() - t) / (rounds * len(pool)))
    return best * 1e6


def main() -> None:
    rng = np.random.default_rng(0)
    tm = TimingModel.create("vr200", "deepseek-v4.1-flash", "rubin-optimized")
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
    cases = [
        (
            "decode wide-ep8, 32 seqs/rank (typical)",
            lambda b: tm.step_time("decode", wide8, b),
            decode_pool(8, 32, 50, rng),
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
            "prefill_estimate_s dep2",
            lambda b: tm.prefill_estimate_s(dep2, int(b.ranks[0].new_tokens[0]), 0),
            prefill,
        ),
    ]
    rows = []
    print(f"{'case':44} {'us/call':>9}")
    for name, fn, pool in cases:
        us = per_call_us(fn, pool)
        rows.append({"case": name, "us_per_call": us})
        print(f"{name:44} {us:9.1f}")
    typical = rows[0]["us_per_call"]
    print(
        f"goal <= {GOAL_US} us for the typical decode batch: {'met' if typical <= GOAL_US else 'NOT met'} ({typical:.1f} us)"
    )
    out = {
        "command": ".venv/bin/python bench/timing_speed.py",
        "timer": "time.process_time, best of 7",
        "load_average_1_5_15": os.getloadavg(),
        "cpu_count": os.cpu_count(),
        "goal_us": GOAL_US,
        "goal_met": typical <= GOAL_US,
        "rows": rows,
    }
    (ROOT / "bench/results/timing_speed.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
