"""The simulator agrees with the live cluster on the same small scenario (issue 6).

One seeded scenario: SESSIONS multi-turn sessions share a system prompt; every turn's prompt
extends the previous turn's prompt; OUTPUT tokens each. It runs live against `live_cluster`
(scenarios/local.yaml: 1 DEP2 prefill, Wide-EP 4 + TP8 decode, 16-token blocks) one request at a
time, and in the simulator on the same deployment, block size (16), prefill chunk (512 tokens),
cache sizes and policy, with arrivals spaced far apart so neither side queues. The requests, in
order and token for token, are the same on both sides.

Tolerances (why), measured on the first run: hit rate 0.7786 live = 0.7786 sim (= the ideal);
TTFT P50 13.869 ms live vs 13.867 ms sim, every request within 0.6%.
- prefix hit rate within 0.02 absolute: both sides route with the same policy code on the same
  block hashes, so they hit the same blocks; 0.02 leaves room for a tie broken the other way.
- TTFT P50 within 5% (each request within 10%): live TTFT is priced by the same TimingModel step
  by step in simulated seconds (pacing and machine load do not enter); the residual is the sim's
  decode leap charging its middle step to every step and sharing the batch's context evenly
  (<1% here). 5% also absorbs a decode rank still busy with an earlier test's stream.
Both hit rates must be most of the ideal (routing or caching broken on either side fails), and the
one fully cold request must be the slowest on both sides.

What the first runs found (fixed, not tolerated): live TTFT was 18% *below* the sim because the
decode service stamped the prefill's first token at the start of the first decode step (first
decode step ~0), while the target's decode rank samples token 1 in that step (the sim's and
DESIGN.md's TTFT = queue + prefill + KV transfer + first decode step); after that, live was 6%
above because the twin's decode rank charged its recompute of the prompt's partial last block
(up to 15 tokens, +1-1.5 ms a step) that the target, which receives that block's KV too, never
does. services/decode/service.py and services/rank_worker.py now account both as the target.
"""

from __future__ import annotations

import statistics

import httpx
import numpy as np
import pytest
import yaml

from rackserve.kv.block_hash import block_hashes
from rackserve.model.config import VOCAB_SIZE
from rackserve.sim.metrics import ideal_hit_rate
from rackserve.sim.run import simulate
from rackserve.sim.scenario import scenario_from_dict
from rackserve.workload.request import Request
from services.launcher import DEFAULT_CONFIG

pytestmark = pytest.mark.integration

MODEL = "rackserve-moe-small"
SEED = 606
SESSIONS = 4
TURNS = 5
OUTPUT = 8
SYSTEM_TOKENS = 200  # shared by every session: 12 full blocks + 8 tokens
FIRST_USER_TOKENS = (60, 90)  # per session, drawn
TURN_TOKENS = (40, 120)  # tool output + user message added per turn, drawn
SPACING_S = 20.0  # simulated seconds between sim arrivals: every request runs alone
HIT_RATE_TOL = 0.02
TTFT_REL_TOL = 0.05
TTFT_EACH_REL_TOL = 0.10


def scenario_prompts(seed: int = SEED) -> list[tuple[int, int, list[int]]]:
    """(session, turn, prompt) in the order they are sent: turn by turn, sessions round-robin."""
    rng = np.random.default_rng(seed)
    draw = lambda n: rng.integers(16, VOCAB_SIZE, size=int(n)).tolist()  # noqa: E731
    system = draw(SYSTEM_TOKENS)
    prompts = [system + draw(rng.integers(*FIRST_USER_TOKENS)) for _ in range(SESSIONS)]
    out = []
    for turn in range(TURNS):
        for s in range(SESSIONS):
            if turn:
                prompts[s] = prompts[s] + draw(rng.integers(*TURN_TOKENS))
            out.append((s, turn, list(prompts[s])))
    return out


def live_config() -> dict:
    with open(DEFAULT_CONFIG) as fh:
        return yaml.safe_load(fh)


def sim_scenario(cfg: dict):
    """The live deployment as a simulator scenario, at the live engine's block and chunk sizes."""
    engine = cfg["engine"]
    rank_tokens = engine["cache_blocks_per_rank"] * engine["block_size"]
    data = {
        "name": "live-agreement",
        "timing": {**cfg["timing"], "target_block_tokens": engine["block_size"]},
        "deployment": cfg["deployment"],
        "routing": {**cfg.get("routing", {}), "seed": 0},
        **({"pool": cfg["pool"]} if "pool" in cfg else {}),
        # unused (the arrivals are given), but a scenario names a workload
        "workload": {"kind": "uniform", "requests": 1, "prompt_tokens": 1, "output_tokens": 1},
        "sim": {
            "prefill_chunk_tokens": engine["prefill_chunk_tokens"],
            "prefill_max_batch_seqs": engine["max_batch_seqs"],
            "decode_max_batch_seqs": engine["max_batch_seqs"],
            "rank_cache_tokens": rank_tokens,
            "decode_kv_tokens_per_rank": rank_tokens,
        },
    }
    return scenario_from_dict(data)


def sim_requests(prompts, block_size: int) -> list[Request]:
    return [
        Request(i, i * SPACING_S, len(p), OUTPUT, tuple(block_hashes(p, block_size, MODEL)), s, t)
        for i, (s, t, p) in enumerate(prompts)
    ]


def run_live(base: str, prompts) -> list[dict]:
    """Send every prompt in order, one at a time; return each reply's usage and rackserve timings."""
    out = []
    with httpx.Client(timeout=120) as client:
        for _, _, prompt in prompts:
            body = {"model": MODEL, "prompt": prompt, "max_tokens": OUTPUT, "temperature": 0,
                    "ignore_eos": True}
            reply = client.post(f"{base}/v1/completions", json=body)
            assert reply.status_code == 200, reply.text
            data = reply.json()
            assert data["usage"]["completion_tokens"] == OUTPUT
            out.append({**data["rackserve"], "prompt_tokens": data["usage"]["prompt_tokens"],
                        "cached": data["usage"]["prompt_tokens_details"]["cached_tokens"]})
    return out


def test_live_and_simulated_ttft_p50_and_hit_rate_agree(live_cluster) -> None:
    cfg = live_config()
    block = cfg["engine"]["block_size"]
    prompts = scenario_prompts()
    requests = sim_requests(prompts, block)
    ideal = ideal_hit_rate(requests, block)

    live = run_live(live_cluster.base_url, prompts)
    assert [r["prompt_tokens"] for r in live] == [len(p) for _, _, p in prompts]
    live_hit = sum(r["cached"] for r in live) / sum(r["prompt_tokens"] for r in live)
    live_ttft = [r["ttft_s"] for r in live]
    assert all(r["queue_s"] < 1e-3 for r in live), [r["queue_s"] for r in live]

    sim = simulate(sim_scenario(cfg), requests)
    assert sim.completed == len(requests) and sim.rejected == 0
    sim_ttft = list(sim.ttft_samples)

    report = (f"hit rate live {live_hit:.4f} sim {sim.hit_rate:.4f} ideal {ideal:.4f}; "
              f"TTFT P50 live {statistics.median(live_ttft) * 1e3:.3f} ms "
              f"sim {statistics.median(sim_ttft) * 1e3:.3f} ms")
    print(report)
    print("live ttft ms", [round(x * 1e3, 3) for x in live_ttft])
    print("sim  ttft ms", [round(x * 1e3, 3) for x in sim_ttft])
    for key in ("prefill_s", "first_decode_s"):
        print("live", key, [round(r[key] * 1e3, 3) for r in live])
    print("live hits", [r["cached"] for r in live], [r["prefill"] for r in live])

    # both sides cache and route: most of the ideal (infinite-cache) hit rate is realised
    assert ideal > 0.5
    assert live_hit > 0.8 * ideal and sim.hit_rate > 0.8 * ideal, report
    assert sim.hit_rate == pytest.approx(live_hit, abs=HIT_RATE_TOL), report
    # the one fully cold request (session 0, turn 0) is the slowest on both sides
    for ttft in (live_ttft, sim_ttft):
        assert max(range(len(ttft)), key=ttft.__getitem__) == 0, report
    assert statistics.median(sim_ttft) == pytest.approx(statistics.median(live_ttft),
                                                        rel=TTFT_REL_TOL), report
    for i, (a, b) in enumerate(zip(live_ttft, sim_ttft, strict=True)):
        assert b == pytest.approx(a, rel=TTFT_EACH_REL_TOL), (i, a, b)
