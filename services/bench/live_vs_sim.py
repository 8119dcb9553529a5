"""Live cluster vs simulator on the same arrivals: send a seeded multi-turn workload open loop to a
running cluster (mock ranks at rack scale), record when each request really left, then run
`rackserve sim` on exactly those arrivals and prompts; TTFT P50/P90, TPOT P50/P90, prefix hit rate
and rank idle side by side, one {"metric", "live", "sim", "rel_err"} row per figure.

Live latencies are the client's wall clock divided by the cluster's time_scale (an independent
measurement: pacing, HTTP, gRPC and Ray all count), as `rackserve bench` reports them; hit rate
from the replies' cached_tokens; rank idle from the workers' rackserve_rank_idle/busy counters.

    .venv/bin/python bench/simulator/live_vs_sim.py --config scenarios/nvl72-vr200.yaml --engine mock \\
        --time-scale auto --sessions 96 --rate 400 --out bench/results/simulator/live_vs_sim_rack.json
starts `rackserve up` itself (or `--url` an already running cluster started with the same config).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx
import numpy as np

from rackserve.config import Config
from rackserve.kv.block_hash import block_hashes
from rackserve.model.config import VOCAB_SIZE
from rackserve.sim.metrics import SimResult
from rackserve.sim.run import simulate
from rackserve.sim.scenario import Scenario, scenario_from_dict
from rackserve.workload.request import Request
from services.bench.client import cluster_info, metrics_text, scrape, stream_completion
from services.bench.outcome import Outcome


@dataclass(frozen=True)
class Shape:
    """The seeded workload: `sessions` conversations share a system prompt; each turn's prompt
    extends the session's previous one; arrivals are Poisson at `rate` per simulated second."""

    sessions: int = 8
    turns: int = 4
    rate: float = 100.0  # requests per simulated second
    output_tokens: int = 16
    system_tokens: int = 200
    first_user_tokens: tuple[int, int] = (60, 90)
    turn_tokens: tuple[int, int] = (40, 120)
    seed: int = 35


@dataclass(frozen=True)
class Planned:
    session: int
    turn: int
    prompt: list[int]
    arrival_s: float  # simulated seconds from the start


def plan(shape: Shape) -> list[Planned]:
    """Turn by turn, sessions round-robin (a session's turn t is sent after its turn t - 1)."""
    rng = np.random.default_rng(shape.seed)
    draw = lambda n: rng.integers(16, VOCAB_SIZE - 8, size=int(n)).tolist()  # noqa: E731
    system = draw(shape.system_tokens)
    prompts = [system + draw(rng.integers(*shape.first_user_tokens)) for _ in range(shape.sessions)]
    n = shape.sessions * shape.turns
    arrivals = np.cumsum(rng.exponential(1.0 / shape.rate, size=n))
    out = []
    for turn in range(shape.turns):
        for s in range(shape.sessions):
            if turn:
                prompts[s] = prompts[s] + draw(rng.integers(*shape.turn_tokens))
            out.append(Planned(s, turn, list(prompts[s]), float(arrivals[len(out)])))
    return out


# -- live ------------------------------------------------------------------------------------------
async def run_live(base: str, planned: list[Planned], output_tokens: int) -> dict:
    """Send each request at its arrival (x time_scale of wall time); returns the outcomes with
    arrival_s = when it really left (simulated s), the time_scale and the idle counters' delta."""
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=1024)) as client:
        info = await cluster_info(client, base)
        scale, model = float(info["time_scale"]), info["model"]
        assert scale > 0, "live vs sim needs a paced cluster (time_scale > 0)"
        before = scrape(await metrics_text(client, base))
        t0 = time.monotonic()

        async def one(i: int, p: Planned) -> Outcome:
            await asyncio.sleep(max(0.0, t0 + p.arrival_s * scale - time.monotonic()))
            out = Outcome(i, len(p.prompt), output_tokens, session=p.session)
            out.arrival_s = (time.monotonic() - t0) / scale
            return await stream_completion(client, base, model, out, p.prompt)

        outcomes = await asyncio.gather(*(one(i, p) for i, p in enumerate(planned)))
        after = scrape(await metrics_text(client, base))
    return {"outcomes": outcomes, "time_scale": scale, "idle": idle_by_role(before, after)}


def idle_by_role(before: dict, after: dict) -> dict[str, float]:
    """Idle share of each role's ranks' lockstep step time between two scrapes."""
    def delta(name: str, role: str) -> float:
        old, new = before.get(name, {}), after.get(name, {})
        return sum(v - old.get(k, 0.0) for k, v in new.items() if ("role", role) in k)

    out = {}
    for role in ("prefill", "decode"):
        idle = delta("rackserve_rank_idle_seconds_total", role)
        busy = delta("rackserve_rank_busy_seconds_total", role)
        out[role] = idle / (idle + busy) if idle + busy > 0 else 0.0
    return out


# -- simulator ---------------------------------------------------------------------------------
def sim_scenario(cfg: Config, time_scale: float) -> Scenario:
    """The live deployment as a simulator scenario at the live engine's block size, chunk, batch
    limits and cache sizes (the live ranks cache small-model blocks, so the sim counts those).
    The KV event lag is the live stack's: `routing.event_lag_s` is a wall-clock lag measured on
    this machine (bench/results/routing/event_lag.json), so in simulated seconds it is that / time_scale."""
    e = cfg.engine
    rank_tokens = e.cache_blocks_per_rank * e.block_size
    data = cfg.model_dump(exclude={"name", "description", "sim", "engine", "cluster", "workload"})
    data |= {
        "name": cfg.name or "live",
        "timing": {**data["timing"], "target_block_tokens": e.block_size},
        "routing": {**data["routing"], "seed": 0, "event_lag_s": cfg.routing.event_lag_s / time_scale},
        "workload": {"kind": "uniform", "requests": 1, "prompt_tokens": 1, "output_tokens": 1},
        "sim": {
            "prefill_chunk_tokens": e.max_num_batched_tokens,
            "prefill_max_batch_seqs": e.max_num_seqs,
            "decode_max_batch_seqs": e.max_num_seqs,
            "rank_cache_tokens": rank_tokens,
            "decode_kv_tokens_per_rank": rank_tokens,
        },
    }
    return scenario_from_dict(data)


def sim_requests(planned: list[Planned], outcomes: list[Outcome], cfg: Config) -> list[Request]:
    """The live run's requests at the arrivals it recorded (sorted, ids in arrival order)."""
    e = cfg.engine
    order = sorted(range(len(planned)), key=lambda i: outcomes[i].arrival_s)
    return [
        Request(k, outcomes[i].arrival_s, len(planned[i].prompt), outcomes[i].max_tokens,
                tuple(block_hashes(planned[i].prompt, e.block_size, e.model_id)),
                planned[i].session, planned[i].turn)
        for k, i in enumerate(order)
    ]


# -- comparison --------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def rows(live: dict, sim: SimResult) -> list[dict]:
    """One row per figure; latencies in simulated ms."""
    ok = [o for o in live["outcomes"] if o.success]
    scale = live["time_scale"]
    ttft = [o.ttft_wall / scale * 1e3 for o in ok]
    tpot = [o.tpot_wall / scale * 1e3 for o in ok if o.tpot_wall is not None]
    hit = sum(o.cached_tokens for o in ok) / max(1, sum(o.prompt_tokens for o in ok))
    pairs = [
        ("ttft_p50_ms", pct(ttft, 50), sim.ttft_p50_s * 1e3),
        ("ttft_p90_ms", pct(ttft, 90), sim.ttft_p90_s * 1e3),
        ("tpot_p50_ms", pct(tpot, 50), sim.tpot_p50_s * 1e3),
        ("tpot_p90_ms", pct(tpot, 90), sim.tpot_p90_s * 1e3),
        ("hit_rate", hit, sim.hit_rate),
        ("prefill_rank_idle", live["idle"]["prefill"], sim.prefill_idle_frac),
        ("decode_rank_idle", live["idle"]["decode"], sim.decode_idle_frac),
    ]
    return [{"metric": m, "live": a, "sim": b, "rel_err": (a - b) / b if b else float("nan")}
            for m, a, b in pairs]


def compare(base: str, cfg: Config, shape: Shape) -> dict:
    """Run the workload live against `base`, then the simulator on its recorded arrivals."""
    planned = plan(shape)
    started = time.monotonic()
    live = asyncio.run(run_live(base, planned, shape.output_tokens))
    live_wall = time.monotonic() - started
    failed = [o.error for o in live["outcomes"] if not o.success]
    sim = simulate(sim_scenario(cfg, live["time_scale"]), sim_requests(planned, live["outcomes"], cfg))
    return {"rows": rows(live, sim), "time_scale": live["time_scale"], "requests": len(planned),
            "failed": len(failed), "errors": failed[:3], "live_wall_s": live_wall,
            "sim_completed": sim.completed, "sim_rejected": sim.rejected,
            "span_s": max(o.arrival_s for o in live["outcomes"])}


def table(result: dict) -> str:
    lines = [f"{'metric':20s}{'live':>12s}{'sim':>12s}{'rel_err':>10s}"]
    for r in result["rows"]:
        lines.append(f"{r['metric']:20s}{r['live']:12.4g}{r['sim']:12.4g}{r['rel_err']:10.1%}")
    return "\n".join(lines)
