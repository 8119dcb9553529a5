"""The issue-14 load on a live cluster: 3 rounds of 64 concurrent streaming requests on the default
deployment (scenarios/local.yaml), once as configured and once with a KV-starved engine, counting
failed streams and the workers' `vllm:num_preemptions_total`, and checking that the starved run's
greedy outputs equal the roomy run's.

    flock /tmp/rackserve-ray.lock .venv/bin/python bench/faults/kv_pressure.py [--starved-blocks 128]
writes bench/results/faults/kv_pressure.json and prints a table. Unpaced (time_scale 0): wall time only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import sys
import time
from pathlib import Path

import httpx
import overload  # bench/faults/overload.py: `rackserve up` as a subprocess, its URLs

from services.launcher import DEFAULT_CONFIG
from services.redis_server import free_port

RESULT = Path(__file__).resolve().parents[1] / "results" / "faults" / "kv_pressure.json"
MODEL = "rackserve-moe-small"
PREEMPTIONS = re.compile(r"^vllm:num_preemptions_total\{[^}]*\} ([0-9.e+]+)$", re.M)


def prompt(i: int, chars: int) -> str:
    rng = random.Random(i)
    words = ["rack", "twin", "decode", "prefill", "block", "cache", "pool", "expert", "token"]
    text = f"stream {i}:"
    while len(text) < chars:
        text += " " + rng.choice(words)
    return text[:chars]


async def one(client: httpx.AsyncClient, base: str, i: int, args) -> tuple[str, str | None]:
    """('ok' | 'failed' | 'rejected_429', generated text)."""
    body = {"model": MODEL, "prompt": prompt(i, args.prompt_chars), "max_tokens": args.max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    try:
        async with client.stream("POST", f"{base}/v1/completions", json=body) as reply:
            if reply.status_code == 429:
                await reply.aread()
                return "rejected_429", None
            text, done = [], False
            async for line in reply.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: ") and '"error"' in line:
                    return "failed", None
                elif line.startswith("data: {"):
                    text += [c.get("text", "") for c in json.loads(line[6:])["choices"]]
            return ("ok" if reply.status_code == 200 and done else "failed"), "".join(text)
    except httpx.HTTPError:
        return "failed", None


async def rounds(base: str, args) -> dict:
    limits = httpx.Limits(max_connections=args.streams + 4, max_keepalive_connections=args.streams + 4)
    out: dict = {"rounds": [], "texts": {}}
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        for r in range(args.rounds):
            ids = range(r * args.streams, (r + 1) * args.streams)
            started = time.monotonic()
            results = await asyncio.gather(*(one(client, base, i, args) for i in ids))
            tally = {k: sum(1 for s, _ in results if s == k) for k in ("ok", "failed", "rejected_429")}
            out["rounds"].append({**tally, "wall_s": round(time.monotonic() - started, 1)})
            out["texts"].update({str(i): t for i, (_, t) in zip(ids, results, strict=True)})
        metrics = (await client.get(f"{base}/metrics")).text
    out["preemptions"] = int(sum(float(v) for v in PREEMPTIONS.findall(metrics)))
    return out


def run(label: str, env: dict[str, str], args) -> dict:
    os.environ.update(env)
    overload.LIMITS = {"TIME_SCALE": "0"}  # the default front-door limits (overload.py sets tiny ones), unpaced
    proc, urls = overload.start_cluster(Path(DEFAULT_CONFIG), free_port())
    try:
        result = asyncio.run(rounds(urls["OpenAI API"].removesuffix("/v1"), args))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        for key in env:
            os.environ.pop(key, None)
    print(label, json.dumps({k: v for k, v in result.items() if k != "texts"}), flush=True)
    return {"label": label, "env": env, **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--prompt-chars", type=int, default=600, help="byte tokenizer: ~tokens")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--starved-blocks", type=int, default=128, help="engine.cache_blocks_per_rank")
    args = parser.parse_args()
    unpaced = {"RACKSERVE_CLUSTER__PROMETHEUS": "false"}
    runs = [run("as configured", unpaced, args),
            run(f"starved ({args.starved_blocks} blocks/rank)",
                {**unpaced, "RACKSERVE_ENGINE__CACHE_BLOCKS_PER_RANK": str(args.starved_blocks)}, args)]
    texts = [r["texts"] for r in runs]
    same = texts[0] == texts[1] and None not in texts[0].values()
    report = {"command": "python bench/faults/kv_pressure.py " + " ".join(sys.argv[1:]), "args": vars(args),
              "greedy_outputs_identical": same,
              "runs": [{k: v for k, v in r.items() if k != "texts"} for r in runs]}
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'run':<28}{'round ok/failed/429':>36}{'preemptions':>13}")
    for r in runs:
        cells = "  ".join(f"{x['ok']}/{x['failed']}/{x['rejected_429']}" for x in r["rounds"])
        print(f"{r['label']:<28}{cells:>36}{r['preemptions']:>13}")
    print(f"greedy outputs identical: {same}")


if __name__ == "__main__":
    main()
