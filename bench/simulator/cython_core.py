"""What compiling the simulator's core buys, as it is: the hot modules of a run (those with self time
in bench/results/simulator/warm_profile.md) compiled by Cython into a copy of the tree, run side by side with
the pure-Python tree on bench/simulator/vs_dynamo.py's Mooncake run (12 DEP2 prefill, 3,993 requests), interleaved,
with the results checked equal.

This measures the "compiled event and KV core" lever of issue 19 without rewriting anything: Cython
compiles the same source (annotations not used as C types: `annotation_typing=False`, so the
semantics stay Python's), removing the bytecode interpreter but keeping every object, dict and
attribute lookup. Needs Cython and a C compiler (not a project dependency):
    .venv/bin/pip install cython

Run: .venv/bin/python bench/simulator/cython_core.py [--repeats 3] [--rounds 2]
-> bench/results/simulator/cython_core.json + a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
import vs_dynamo  # noqa: E402  (run_ours, run_baseline)

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "bench" / "results" / "simulator" / "cython_core.json"
# Every module with self time in a warm run's profile (bench/results/simulator/warm_profile.md), >= 0.5% each.
HOT = [
    "sim/simulator.py", "sim/live_view.py", "sim/kv.py", "sim/decode_side.py", "sim/step_cache.py",
    "sim/events.py", "sim/instances.py", "sim/metrics.py", "sim/block_keys.py", "sim/pool_paths.py",
    "kv/pool_put.py", "kv/pool_chains.py", "kv/pool_tiers.py", "kv/pool_outbox.py",
    "sched/scheduler.py", "sched/decode_batch.py", "sched/seq_state.py",
    "routing/policies/least_uncached.py", "routing/timing_cost.py", "routing/router.py",
    "routing/index_lookup.py", "routing/view.py", "routing/match.py",
]
SAME = ("requests", "events", "timing_calls", "timing_misses", "hit_rate", "ttft_p50_ms", "tpot_p50_ms")


def build(tree: Path) -> float:
    """Copy rackserve/ into `tree` and compile HOT there in place; returns the build's wall s."""
    shutil.copytree(ROOT / "rackserve", tree / "rackserve", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "Cython.Build.Cythonize", "-i", "-3", "-j", str(os.cpu_count() or 1),
                    "-X", "annotation_typing=False", *[f"rackserve/{m}" for m in HOT]],
                   cwd=tree, check=True, capture_output=True, text=True)
    missing = [m for m in HOT if not list((tree / "rackserve" / m).parent.glob(Path(m).stem + ".*.so"))]
    if missing:
        raise RuntimeError(f"not compiled: {missing}")
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="warm runs per side and round (median)")
    ap.add_argument("--rounds", type=int, default=2, help="pure / compiled pairs, alternating")
    ap.add_argument("--group", type=int, default=8, help="KV blocks per simulated block (bench/simulator/vs_dynamo.py's 8)")
    args = ap.parse_args()
    try:
        import Cython  # noqa: F401
    except ImportError:
        sys.exit("Cython is not installed: .venv/bin/pip install cython (see this script's docstring)")
    with tempfile.TemporaryDirectory(prefix="rackserve-cy-") as tmp:
        tree = Path(tmp)
        build_s = build(tree)
        pure, compiled = [], []
        for r in range(args.rounds):  # alternate the order, so both sides see the same load
            sides = [(pure, ROOT), (compiled, tree)] if r % 2 == 0 else [(compiled, tree), (pure, ROOT)]
            for runs, root in sides:
                runs.append(vs_dynamo.run_baseline(root, vs_dynamo.TRACE, args.group, "least-uncached-work", args.repeats))
    for p, c in zip(pure, compiled, strict=True):
        diff = {k: (p[k], c[k]) for k in SAME if p[k] != c[k]}
        if diff:
            raise SystemExit(f"compiled results differ from pure Python: {diff}")
    med = {name: {k: statistics.median(run[k] for run in runs)
                  for k in ("warm_ms_per_request", "warm_cpu_ms_per_request", "cold_ms_per_request")}
           for name, runs in (("pure", pure), ("compiled", compiled))}
    ratio = {k: med["compiled"][k] / med["pure"][k] for k in med["pure"]}
    result = {"command": "python bench/simulator/cython_core.py" + (f" --repeats {args.repeats}" if args.repeats != 3 else "")
              + (f" --rounds {args.rounds}" if args.rounds != 2 else ""),
              "commit": vs_dynamo._commit(), "load_average_1m": os.getloadavg()[0], "cpus": os.cpu_count(),
              "compiled_modules": HOT, "cython_directives": {"annotation_typing": False}, "build_wall_s": build_s,
              "results_equal": list(SAME), "pure": pure, "compiled": compiled, "median": med,
              "ratio_compiled_over_pure": ratio, "goal_ms_per_request": vs_dynamo.GOAL_MS}
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    table = Table(title=f"simulator, pure Python vs Cython-compiled core ({pure[0]['requests']} Mooncake requests, "
                        f"group={args.group}, load {result['load_average_1m']:.1f})")
    for col in ("tree", "warm wall ms/req", "warm CPU ms/req", "cold wall ms/req"):
        table.add_column(col, justify="right")
    for name in ("pure", "compiled"):
        m = med[name]
        table.add_row(name, f"{m['warm_ms_per_request']:.3f}", f"{m['warm_cpu_ms_per_request']:.3f}",
                      f"{m['cold_ms_per_request']:.3f}")
    table.add_row("compiled / pure", *(f"{ratio[k]:.2f}x" for k in
                                       ("warm_ms_per_request", "warm_cpu_ms_per_request", "cold_ms_per_request")))
    Console().print(table)
    print(f"results equal ({', '.join(SAME)}); wrote {RESULT}", file=sys.stderr)


if __name__ == "__main__":
    main()
