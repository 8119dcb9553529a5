"""The simulator agrees with the live cluster on the same small scenario (issue 6).

Two checks of different strength (issue 17): `..._are_consistent` compares the live cluster's own
accounting (simulated seconds priced by the same TimingModel) with the simulator, a consistency
check; `test_live_wall_clock_ttft_agrees_with_the_simulator` compares the client's wall clock
(divided by time_scale) with the simulator, an independent measurement (tolerances stated there).

One seeded scenario: SESSIONS multi-turn sessions share a system prompt; every turn's prompt
extends the previous turn's prompt; OUTPUT tokens each. It runs live against `live_cluster`
(scenarios/local.yaml: 1 DEP2 prefill, Wide-EP 4 + TP8 decode, 16-token blocks) one request at a
time, and in the simulator on the same deployment, block size (16), prefill chunk (512 tokens),
cache sizes and policy, with arrivals spaced far apart so neither side queues. The requests, in
order and token for token, are the same on both sides.

Tolerances (why), measured on the first run: hit rate 0.7786 live = 0.7786 sim (= the ideal);
TTFT P50 13.869 ms live vs 13.867 ms sim, every request within 0.6% (with the partial last block
charged on both sides, issue 17 item 3: 13.126 vs 13.131 ms, every request within 0.6%).
- prefix hit rate within 0.02 absolute: both sides route with the same policy code on the same
  block hashes, so they hit the same blocks; 0.02 leaves room for a tie broken the other way.
- TTFT P50 within 5% (each request within 10%): live TTFT is priced by the same TimingModel step
  by step in simulated seconds (pacing and machine load do not enter); the residual is the sim's
  decode leap charging its middle step to every step and sharing the batch's context evenly
  (<1% here). 5% also absorbs a decode rank still busy with an earlier test's stream.
Both hit rates must be most of the ideal (routing or caching broken on either side fails), and the
one fully cold request must be slower than the median on both sides.

What the first runs found (fixed, not tolerated): live TTFT was 18% *below* the sim because the
decode service stamped the prefill's first token at the start of the first decode step (first
decode step ~0), while the target's decode rank samples token 1 in that step (the sim's and
DESIGN.md's TTFT = queue + prefill + KV transfer + first decode step); after that, live was 6%
above because the twin's decode rank charged its recompute of the prompt's partial last block
(up to 15 tokens, +1-1.5 ms a step) and the simulator did not. Both now charge what the engine
computes (issue 17 item 3): the hand-off moves full blocks, so the first decode step computes the
partial last block and the first token, live (services/rank_worker.py) and simulated
(rackserve/sim/decode_side.py) alike.
"""

from __future__ import annotations

import json
import statistics
import time

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
PACED_TIME_SCALE = 20.0  # wall s per simulated s: a ~14 ms simulated TTFT lasts ~0.28 s of wall time
# Measured on the first run (2-core box): wall/20 minus simulated TTFT 1.1-1.8 ms a request (22-36
# ms of wall overhead; the cold first one 5.4 ms = 108 ms), median 12.8 ms wall vs 11.2 ms sim (+14%).
WALL_OVERHEAD_S = 0.3  # wall seconds a request may spend outside paced steps (3x the worst seen)
WARM_UP = 2  # unmeasured first requests of the paced run (see warm_up_prompts)
WALL_P50_REL_TOL = 0.3  # median wall TTFT vs simulated (2x the +14% seen: overhead grows with load)


def scenario_prompts(seed: int = SEED, sessions: int = SESSIONS) -> list[tuple[int, int, list[int]]]:
    """(session, turn, prompt) in the order they are sent: turn by turn, sessions round-robin."""
    rng = np.random.default_rng(seed)
    draw = lambda n: rng.integers(16, VOCAB_SIZE, size=int(n)).tolist()  # noqa: E731
    system = draw(SYSTEM_TOKENS)
    prompts = [system + draw(rng.integers(*FIRST_USER_TOKENS)) for _ in range(sessions)]
    out = []
    for turn in range(TURNS):
        for s in range(sessions):
            if turn:
                prompts[s] = prompts[s] + draw(rng.integers(*TURN_TOKENS))
            out.append((s, turn, list(prompts[s])))
    return out


def live_config() -> dict:
    with open(DEFAULT_CONFIG) as fh:
        return yaml.safe_load(fh)


def sim_scenario(cfg: dict, policy: str | None = None):
    """The live deployment as a simulator scenario, at the live engine's block and chunk sizes
    (routing by `policy`, default the config's)."""
    engine = cfg["engine"]
    rank_tokens = engine["cache_blocks_per_rank"] * engine["block_size"]
    data = {
        "name": "live-agreement",
        "timing": {**cfg["timing"], "target_block_tokens": engine["block_size"]},
        "deployment": cfg["deployment"],
        "routing": {**cfg.get("routing", {}), "seed": 0, **({"policy": policy} if policy else {})},
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
    """Send every prompt in order, one at a time, streamed; return each reply's usage, rackserve
    timings (simulated s) and the client's own wall-clock time to the first token."""
    out = []
    with httpx.Client(timeout=120) as client:
        for _, _, prompt in prompts:
            body = {"model": MODEL, "prompt": prompt, "max_tokens": OUTPUT, "temperature": 0,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
            sent = time.perf_counter()
            first_s, events = None, []
            with client.stream("POST", f"{base}/v1/completions", json=body) as reply:
                assert reply.status_code == 200, reply.read()
                for line in reply.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[len("data: ") :])
                    if first_s is None and event.get("choices") and event["choices"][0]["text"]:
                        first_s = time.perf_counter() - sent
                    events.append(event)
            usage = events[-1]["usage"]
            timings = next(e["rackserve"] for e in reversed(events) if "rackserve" in e)
            assert usage["completion_tokens"] == OUTPUT and first_s is not None
            out.append({**timings, "prompt_tokens": usage["prompt_tokens"],
                        "cached": usage["prompt_tokens_details"]["cached_tokens"],
                        "wall_ttft_s": first_s})
    return out


@pytest.fixture(scope="module")
def both_runs(live_cluster):
    """The scenario once live and once simulated (shared by the tests of this module)."""
    cfg = live_config()
    block = cfg["engine"]["block_size"]
    prompts = scenario_prompts()
    requests = sim_requests(prompts, block)
    live = run_live(live_cluster.base_url, prompts)
    sim = simulate(sim_scenario(cfg), requests)
    return {"cfg": cfg, "prompts": prompts, "requests": requests, "live": live, "sim": sim}


def test_live_accounting_and_simulator_are_consistent(both_runs) -> None:
    """A consistency check, not an independent measurement: the live TTFT compared here is the
    live cluster's own accounting, priced step by step by the same TimingModel the simulator
    runs. What it catches: the two sides routing, caching, batching or charging differently."""
    cfg, prompts, requests = both_runs["cfg"], both_runs["prompts"], both_runs["requests"]
    live, sim = both_runs["live"], both_runs["sim"]
    block = cfg["engine"]["block_size"]
    ideal = ideal_hit_rate(requests, block)

    assert [r["prompt_tokens"] for r in live] == [len(p) for _, _, p in prompts]
    live_hit = sum(r["cached"] for r in live) / sum(r["prompt_tokens"] for r in live)
    live_ttft = [r["ttft_s"] for r in live]
    assert all(r["queue_s"] < 1e-3 for r in live), [r["queue_s"] for r in live]

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
    # the one fully cold request (session 0, turn 0) is slower than most on both sides (not
    # necessarily the slowest: since both charge the first decode step's partial last block, up
    # to 15 tokens, a long warm turn may outlast it, by 0.1 ms here)
    for ttft in (live_ttft, sim_ttft):
        assert ttft[0] > statistics.median(ttft), report
    assert statistics.median(sim_ttft) == pytest.approx(statistics.median(live_ttft),
                                                        rel=TTFT_REL_TOL), report
    for i, (a, b) in enumerate(zip(live_ttft, sim_ttft, strict=True)):
        assert b == pytest.approx(a, rel=TTFT_EACH_REL_TOL), (i, a, b)


def warm_up_prompts() -> list[tuple[int, int, list[int]]]:
    """WARM_UP requests of their own session and tokens (nothing shared with the scenario), sent
    first on both sides and left out of the comparison: a fresh cluster's first request pays
    one-time costs (first gRPC channel, first Ray call, lazy imports, empty step memo) that are not
    per-request overhead. CI once saw 332 ms of it on the first request (issue 19's stop 24)."""
    rng = np.random.default_rng(SEED + 1)
    return [(SESSIONS + k, 0, rng.integers(16, VOCAB_SIZE, size=150).tolist()) for k in range(WARM_UP)]


@pytest.fixture(scope="module")
def paced_cluster():
    """The same deployment (scenarios/local.yaml) paced at PACED_TIME_SCALE wall s per simulated s,
    so a step's wall time dwarfs the software's own per-hop overhead."""
    from services.redis_server import free_port
    from tests.e2e.launcher_proc import LauncherProcess, launcher_command

    proc = LauncherProcess(launcher_command("--port", str(free_port())),
                           env={"RACKSERVE_CLUSTER__TIME_SCALE": str(PACED_TIME_SCALE)})
    proc.start(timeout_s=240)
    yield proc
    proc.stop()


def test_live_wall_clock_ttft_agrees_with_the_simulator(paced_cluster) -> None:
    """The independent comparison: the client's own stopwatch (time to the first streamed token,
    wall seconds / time_scale) against the simulator's TTFT for the same requests. Pacing makes
    every live step last at least its simulated time x time_scale, so the wall TTFT is never
    below the simulated one (2% for timer granularity); above it is the real software's overhead
    (HTTP, gRPC, Ray calls, a loaded 2-core machine): at most WALL_OVERHEAD_S wall per request,
    and the median within WALL_P50_REL_TOL. A twin whose steps were not paced as the cost model
    says, or that lost time between its hops, fails here even when its accounting agrees."""
    warm = warm_up_prompts()
    prompts = warm + scenario_prompts()
    live = run_live(paced_cluster.base_url, prompts)[len(warm) :]
    cfg = live_config()
    requests = sim_requests(prompts, cfg["engine"]["block_size"])
    sim = list(simulate(sim_scenario(cfg), requests).ttft_samples)[len(warm) :]
    assert len(sim) == len(live) == len(prompts) - len(warm)
    wall = [r["wall_ttft_s"] / PACED_TIME_SCALE for r in live]
    print("wall ttft ms", [round(x * 1e3, 3) for x in wall])
    print("sim  ttft ms", [round(x * 1e3, 3) for x in sim])
    for i, (w, t) in enumerate(zip(wall, sim, strict=True)):
        assert w >= 0.98 * t, (i, w, t)  # pacing: never faster than the rack it emulates
        assert w <= t + WALL_OVERHEAD_S / PACED_TIME_SCALE, (i, w, t)
    assert statistics.median(wall) == pytest.approx(statistics.median(sim), rel=WALL_P50_REL_TOL)
