"""Live cluster vs simulator on the same arrivals (the comparison itself is
services/bench/live_vs_sim.py; this is its command line).

    .venv/bin/python bench/simulator/live_vs_sim.py --config scenarios/nvl72-vr200.yaml --engine mock \\
        --time-scale auto --sessions 96 --rate 400 --out bench/results/simulator/live_vs_sim_rack.json
starts `rackserve up` itself (or `--url` an already running cluster started with the same config).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rackserve.config import load_config
from services.bench.live_vs_sim import Shape, compare, table
from services.redis_server import free_port


# -- the cluster ---------------------------------------------------------------------------------
def start_cluster(port: int, launcher_args: list[str], timeout_s: float = 300.0
                  ) -> tuple[subprocess.Popen, float]:
    """`rackserve up` with `launcher_args`; returns it and the seconds it took to be up."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "services.launcher", "--port", str(port),
                             "--timeout", str(timeout_s), *launcher_args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:  # type: ignore[union-attr]
        print(line, end="", flush=True)
        if line.strip().startswith("logs"):
            return proc, time.monotonic() - started
    raise RuntimeError("rackserve up exited before it was up")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="scenarios/local.yaml")
    parser.add_argument("--engine", default="mock", choices=("real", "mock"))
    parser.add_argument("--time-scale", default="auto")
    parser.add_argument("--url", default=None, help="a running cluster (else one is started)")
    parser.add_argument("--sessions", type=int, default=Shape.sessions)
    parser.add_argument("--turns", type=int, default=Shape.turns)
    parser.add_argument("--rate", type=float, default=Shape.rate, help="requests per simulated s")
    parser.add_argument("--out", default=None, help="write the JSON here")
    args = parser.parse_args()
    os.environ["RACKSERVE_ENGINE__KIND"] = args.engine
    cfg = load_config(args.config)
    shape = Shape(sessions=args.sessions, turns=args.turns, rate=args.rate)
    proc, up_s = None, None
    base = args.url
    if base is None:
        port = free_port()
        proc, up_s = start_cluster(port, ["--config", args.config, "--engine", args.engine,
                                          "--time-scale", args.time_scale])
        base = f"http://127.0.0.1:{port}"
    try:
        result = compare(base, cfg, shape)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
    result = {"command": "bench/simulator/live_vs_sim.py " + " ".join(sys.argv[1:]), "config": args.config,
              "engine": args.engine, "shape": shape.__dict__, "up_s": up_s,
              "load_avg_1m": os.getloadavg()[0], **result}
    print(table(result))
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, default=str))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
