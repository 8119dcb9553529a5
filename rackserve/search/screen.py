"""The analytic screen: a predicted curve of throughput/GPU against interactivity for one
configuration, in a fraction of a second, from the trace's request mix and the cost model.

The rack is a closed loop (AgentX: `C` lanes, each sends, waits for the whole answer, thinks, sends
again), so by Little's law C = X x (think + E2E) / parallelism, X being requests/s. The screen walks
X from 1% to 99% of the rack's capacity and for each X prices:
- decode: the batch per decode rank b solving b = X (out - 1) TPOT / ranks (Little again), TPOT
  from the cost model at the mix's mean context for the batch a sequence sees: itself and b others
  (a random sequence's rank holds 1 + Poisson(b)), or, in a lockstep instance, the busiest rank's
  expected maximum of `ranks` Poisson(b) loads; a decode slot is waited for (Erlang C) when b nears
  the batch cap (max_num_seqs or the KV that fits);
- prefill: every DP rank a server of uncached tokens at its saturated rate, priced on full lockstep
  steps of the mix's own requests (pieces at their own cached context; a step lasts as long as its
  slowest rank, which is the replay's prefill rank idle); the wait for a rank is Erlang C over all
  prefill ranks (the router sends a request where the least uncached work waits) plus the residual
  of the step its instance is in when it arrives; a request's own prefill is its lone step(s),
  shared with the rank's other prefills (processor sharing, / (1 - rho));
- the P/D hand-off (pd_transfer_s) and, for the part of the prefix that does not fit the prefill
  ranks' own HBM caches, the pool fetch (kv_transfer_s over the DRAM tier).
The mix counts a prompt's share with its agent's previous turn as cached in the simulator's cache
blocks (search/mix.py). Each of these terms was found by taking replayed requests' TTFT and TPOT
apart against the screen's (issue 30's closing note gives the before and after).
Past capacity, more lanes only queue: the curve continues at X = capacity with the extra lanes'
wait on every request. Interactivity per request (E2E-normalized and ITL-based) comes from the mix's
own output lengths, so P50 and P90 differ as the mix makes them differ.
What it leaves out, and the replay measures: how the requests finishing in the window shift toward
later, longer turns once the rack saturates (the knee comes earlier than the screen's), bursts in
the arrivals of one conversation tree, pool evictions. `screen_error` in frontier.json says how much.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rackserve.search.mix import Mix
from rackserve.search.queueing import waits
from rackserve.search.rack import Config, RackSpec, scenario_of
from rackserve.sim.sizing import size_scenario
from rackserve.timing.batch import RankBatch, StepBatch
from rackserve.timing.timing_model import TimingModel

RHO = np.array([0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.93, 0.95,
                0.97, 0.98, 0.99])
OVERLOAD = (1.25, 1.5, 2.0, 3.0)  # lanes past the knee, as multiples of the lanes at 99%
SAMPLES = 4096  # requests of the mix priced per point (a fixed, seeded draw)
TAIL_Z = 1.2816  # standard normal 90th percentile: a decode rank's batch at its own P90


@dataclass(frozen=True)
class ScreenCurve:
    config: Config
    points: list[dict]
    bound: str  # what caps throughput: "prefill" | "decode"
    capacity_rps: float
    note: str = ""


class TimingCache:
    """One TimingModel per timing section (hardware, model, optimizations incl. MTP), and the price
    tables built from it, shared by the configurations a screen prices."""

    def __init__(self) -> None:
        self._models: dict[str, TimingModel] = {}
        self._tables: dict[tuple, object] = {}

    def get(self, scenario) -> TimingModel:
        key = scenario.config.timing.model_dump_json()
        if key not in self._models:
            self._models[key] = TimingModel.from_section(scenario.config.timing)
        return self._models[key]

    def memo(self, key: tuple, make):
        if key not in self._tables:
            self._tables[key] = make()
        return self._tables[key]


def decode_kv_slots(sizing, ctx: int) -> int:
    """Sequences of `ctx` tokens a decode rank's KV can hold: its whole KV memory (a rank keeps what
    its batch holds and lends the rest to the pool, issue 31), or the scenario's KV-token override."""
    if "sim.decode_kv_tokens_per_rank" in sizing.overrides:
        return int(sizing.decode_kv_tokens[0] // max(ctx, 1))
    cap = sizing.capacity
    per_seq = ctx * cap.kv_bytes_per_token + cap.window_buffer_bytes
    return int(cap.decode[0].memory.kv_bytes // per_seq)


def _layout(tm: TimingModel, name: str, ranks: int):
    return tm.layout(name, ranks if name == "wide-ep" else None)


def expected_max_poisson(mean: float, n: int) -> float:
    """E[max of n independent Poisson(mean) loads]: the busiest of n ranks that a router fills evenly
    at random (sum over k of P(max > k) = 1 - F(k)^n)."""
    if n <= 1 or mean <= 0:
        return max(mean, 0.0)
    total, k, pmf = 0.0, 0, math.exp(-mean)
    cdf = pmf
    while k < mean + 12 * math.sqrt(mean) + 12:
        total += 1.0 - cdf**n
        k += 1
        pmf *= mean / k
        cdf += pmf
    return total


def _tpot_table(tm: TimingModel, layout, b_cap: int, context: int) -> tuple[np.ndarray, np.ndarray]:
    """TPOT against the mean batch per rank b (0.05..b_cap); in a lockstep instance the busiest rank
    carries E[max of dp Poisson(b)] sequences and sets the step."""
    grid = np.unique(np.concatenate([np.geomspace(0.05, 1, 6), np.round(np.geomspace(1, max(b_cap, 1), 24))]))
    dp = layout.dp
    out = []
    for b in grid:
        busy = int(min(b_cap, max(1, round(max(expected_max_poisson(float(b), dp), b + 1)))))
        rest = int(min(b_cap, round(b)))
        ranks = [RankBatch.of([1] * busy, [context - 1] * busy)] + \
            [RankBatch.of([1] * rest, [context - 1] * rest)] * (dp - 1)
        out.append(tm.decode_token_time(layout, StepBatch(tuple(ranks))).total_s)
    return grid.astype(np.float64), np.asarray(out)


def _interp_log(x: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    return np.exp(np.interp(np.log(np.maximum(x, xs[0])), np.log(xs), np.log(ys)))


FULL_STEPS = 64  # full lockstep prefill steps sampled per (layout, chunk) to price a saturated rank


def _full_steps(tm: TimingModel, layout, chunk: int, mix: Mix) -> tuple[float, float]:
    """(a saturated rank's rate in uncached tokens/s, the mean full step's seconds): FULL_STEPS lockstep
    steps whose every rank fills `chunk` tokens with pieces of the mix's requests, drawn in proportion
    to their uncached tokens, each piece at its own cached context. A lockstep step lasts as long as
    its slowest rank, so the rate carries the DEP imbalance the replay measures as prefill rank idle."""
    rng = np.random.default_rng(1)
    weight = mix.uncached / mix.uncached.sum()
    draws = iter(rng.choice(mix.uncached.size, size=FULL_STEPS * layout.dp * (chunk // 64 + 1), p=weight))
    total_s = 0.0
    for _ in range(FULL_STEPS):
        ranks = []
        for _ in range(layout.dp):
            new, cached, left = [], [], chunk
            while left > 0:
                i = next(draws)
                u = int(mix.uncached[i])
                piece = min(left, u)
                new.append(piece)
                cached.append(int(mix.cached[i]) + int(rng.integers(0, u - piece + 1)))
                left -= piece
            ranks.append(RankBatch.of(new, cached))
        total_s += tm.step_time("prefill", layout, StepBatch(tuple(ranks))).total_s
    return chunk * FULL_STEPS / total_s, total_s / FULL_STEPS


def _prefill_prices(tm: TimingModel, layout, chunk: int, mix: Mix) -> tuple[float, float, np.ndarray, np.ndarray]:
    """(rank rate in uncached tokens/s at full chunks, the full step's seconds, lone-step grid, its
    seconds): a request's lone step(s) at the mix's mean cached context, the others idle."""
    rate, full_s = _full_steps(tm, layout, chunk, mix)
    cached = int(round(mix.cached.mean()))
    grid = np.unique(np.round(np.geomspace(16, chunk, 16)).astype(int))
    lone = []
    for u in grid:
        rb = RankBatch.of([int(u)], [cached])
        idle = RankBatch.of([], [])
        lone.append(tm.step_time("prefill", layout, StepBatch((rb,) + (idle,) * (layout.dp - 1))).total_s)
    return rate, full_s, grid.astype(np.float64), np.asarray(lone)


def _step_boundary(x: np.ndarray, lone: np.ndarray, steps: np.ndarray, p_ranks: int, dp: int,
                   rng: np.random.Generator) -> np.ndarray:
    """Per point and sampled request: the wait for its instance's step in progress. A lockstep
    instance is stepping while any of its `dp` ranks is (each rank busy X x E[lone] / ranks of the
    time, a request's lone steps being its busy time at low load); a request that arrives then waits
    out the step's residual: uniform over a step drawn in proportion to the time steps take."""
    per_step = lone / steps
    busy = np.minimum(x * float(lone.mean()) / p_ranks, 1.0)
    stepping = 1.0 - (1.0 - busy) ** dp
    n = lone.size
    drawn = rng.choice(n, n, p=lone / lone.sum())  # a step of request i takes lone_i of the time
    residual = per_step[drawn] * rng.random(n)
    return np.where(rng.random(n)[None, :] < stepping[:, None], residual[None, :], 0.0)


def _solve_batch(x_rps: np.ndarray, out_mean: float, ranks: int, b_grid, tpot_grid, b_cap: int) -> np.ndarray:
    """Mean decode batch per rank at each X: b = X (out - 1) TPOT(b) / ranks, by bisection, capped."""
    lo, hi = np.zeros_like(x_rps), np.full_like(x_rps, float(b_cap))
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        need = x_rps * (out_mean - 1) * _interp_log(np.maximum(mid, 0.05), b_grid, tpot_grid) / ranks
        lo, hi = np.where(need > mid, mid, lo), np.where(need > mid, hi, mid)
    return 0.5 * (lo + hi)


def screen_config(rack: RackSpec, config: Config, mix: Mix, cache: TimingCache) -> ScreenCurve:
    """The predicted curve of one configuration; ValueError when it does not fit the GPUs' memory."""
    sc = scenario_of(rack, config)
    sizing = size_scenario(sc)  # raises ValueError when weights + workspace do not fit
    tm = cache.get(sc)
    pl = _layout(tm, config.prefill_layout, config.prefill_ranks)
    dl = _layout(tm, config.decode_layout, config.decode_ranks)
    gpus = config.gpus
    rng = np.random.default_rng(0)
    pick = rng.integers(0, mix.prompt.size, SAMPLES)
    prompt, out, unc = mix.prompt[pick], mix.output[pick], mix.uncached[pick]
    u_wait = rng.permutation((np.arange(SAMPLES) + 0.5) / SAMPLES)
    ctx = int(np.mean(prompt + out / 2))

    # decode
    d_ranks = config.decode_count * dl.dp
    b_cap = max(1, min(sizing.decode_max_seqs[0], decode_kv_slots(sizing, ctx)))
    b_grid, tpot_grid = cache.memo(("tpot", id(tm), dl.key, b_cap, ctx), lambda: _tpot_table(tm, dl, b_cap, ctx))
    out_mean = float(out.mean())
    x_dec = d_ranks * b_cap / (max(out_mean - 1, 1.0) * tpot_grid[-1])

    # prefill
    p_ranks = config.prefill_count * pl.dp
    rate, full_s, lone_grid, lone_s = cache.memo(
        ("prefill", id(tm), pl.key, config.max_num_batched_tokens),
        lambda: _prefill_prices(tm, pl, config.max_num_batched_tokens, mix))
    unc_mean = float(mix.uncached.mean())
    x_pre = p_ranks * rate / unc_mean
    cap = min(x_pre, x_dec)
    bound = "prefill" if x_pre <= x_dec else "decode"

    x = cap * RHO
    rho_p, rho_d = x / x_pre, x / x_dec
    b = _solve_batch(x, out_mean, d_ranks, b_grid, tpot_grid, b_cap)
    tpot = _interp_log(np.maximum(b, 0.05), b_grid, tpot_grid)
    tpot90 = _interp_log(np.maximum(b + TAIL_Z * np.sqrt(b), 0.05), b_grid, tpot_grid)
    # a request's own prefill: its lone step(s), shared with the rank's other prefills as it fills
    # (processor sharing: stretched by 1 / (1 - rho))
    chunk = config.max_num_batched_tokens
    steps = np.ceil(unc / chunk)
    lone = _interp_log(np.minimum(unc, chunk), lone_grid, lone_s) * steps
    own = lone[None, :] / (1.0 - np.minimum(rho_p, RHO[-1]))[:, None]
    w_pre = waits(p_ranks, rho_p, unc_mean / rate, u_wait) + _step_boundary(x, lone, steps, p_ranks, pl.dp, rng)
    slot_s = max(out_mean - 1, 1.0) * tpot_grid[-1]
    w_dec = waits(d_ranks * b_cap, rho_d, slot_s, u_wait[::-1].copy())
    hand = cache.memo(("hand", id(tm)), lambda: np.array([tm.pd_transfer_s(int(p)) for p in prompt]))
    ttft = w_pre + own + hand[None, :] + w_dec
    lanes = x * (mix.think_s.mean() + (ttft + (out[None, :] - 1) * tpot[:, None]).mean(axis=1)) / mix.parallelism
    fetch = _pool_fetch(tm, sizing, p_ranks, lanes, prompt, unc)
    ttft = ttft + fetch
    e2e = ttft + (out[None, :] - 1) * tpot[:, None]
    lanes = x * (mix.think_s.mean() + e2e.mean(axis=1)) / mix.parallelism

    rows = []
    for i in range(len(x)):
        rows.append(_point(lanes[i], x[i], gpus, mix, e2e[i], out, ttft[i], tpot[i], tpot90[i], b[i], rho_p[i],
                           rho_d[i]))
    knee = rows[-1]
    for k in OVERLOAD:  # past the knee: the extra lanes wait in the bottleneck's queue
        more = knee["concurrency"] * k
        extra = (more - knee["concurrency"]) * mix.parallelism / x[-1]
        rows.append(_point(more, x[-1], gpus, mix, e2e[-1] + extra, out, ttft[-1] + extra, tpot[-1], tpot90[-1],
                           b[-1], rho_p[-1], rho_d[-1]))
    note = f"{bound}-bound at {cap:.1f} req/s (prefill {x_pre:.1f}, decode {x_dec:.1f}; batch cap {b_cap})"
    return ScreenCurve(config, [r for r in rows if r["concurrency"] >= 1], bound, cap, note)


def _pool_fetch(tm: TimingModel, sizing, p_ranks: int, lanes: np.ndarray, prompt: np.ndarray,
                unc: np.ndarray) -> np.ndarray:
    """Per point and request: time to bring the cached prefix the rank's own HBM cannot hold from the
    pool's DRAM tier (the live prefixes of all lanes spread over the prefill ranks)."""
    rank_cache = float(sizing.prefill_cache_tokens[0])
    live = lanes * float(prompt.mean()) / p_ranks  # prefix tokens per rank's share of lanes
    from_pool = np.clip(1.0 - rank_cache / np.maximum(live, 1.0), 0.0, 1.0)
    cached = prompt - unc
    per_token = tm.kv_transfer_s(1 << 20, "pool_dram") / (1 << 20)
    return from_pool[:, None] * cached[None, :] * per_token


def _point(lanes: float, x: float, gpus: int, mix: Mix, e2e: np.ndarray, out: np.ndarray, ttft: np.ndarray,
           tpot: float, tpot90: float, batch: float, rho_p: float, rho_d: float) -> dict:
    spt = e2e / out
    tokens = float(mix.prompt.mean() + mix.output.mean())
    row = {
        "concurrency": int(round(lanes)), "throughput_per_gpu": x * tokens / gpus,
        "tps_user_e2e_p50": 1.0 / float(np.percentile(spt, 50)), "tps_user_e2e_p90": 1.0 / float(np.percentile(spt, 90)),
        "tps_user_itl_p50": 1.0 / tpot, "tps_user_itl_p90": 1.0 / tpot90,
        "ttft_p50_s": float(np.percentile(ttft, 50)), "ttft_p90_s": float(np.percentile(ttft, 90)),
        "requests_per_s": x, "decode_batch_per_rank": batch, "prefill_use": rho_p, "decode_use": rho_d,
    }
    return {k: v if isinstance(v, int) else float(v) for k, v in row.items()}


