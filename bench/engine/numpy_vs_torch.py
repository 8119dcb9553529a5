"""Benchmark: the numpy MoE engine's forward vs. an equivalent PyTorch (CPU) implementation.

Same weights, same math, same paged-KV layout and algorithm (prefill in query tiles, decode as one
padded batch over gathered blocks). Measures prefill tokens/s (one sequence of 512 and 4096 tokens)
and decode tokens/s (batch 1, 8, 64 at context 512), medians of several repetitions, both with the
same number of BLAS/intra-op threads. numpy and torch reps alternate, and both wall-clock and
process CPU time are kept: on a shared machine CPU time is the robust measure of compute cost.
Writes bench/results/engine/numpy_vs_torch.json and prints a table.

    .venv/bin/pip install /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
    .venv/bin/python bench/engine/numpy_vs_torch.py [--threads 1] [--reps 7]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from threadpoolctl import threadpool_limits

from rackserve.kv.paged_kv import PagedKV
from rackserve.model.config import ModelConfig
from rackserve.model.engram import NUM_TABLES, LocalEngramTable, engram_row_ids
from rackserve.model.transformer import Segment, Transformer, query_tile
from rackserve.model.weights import ModelWeights, init_weights

RESULTS = Path(__file__).resolve().parents[1] / "results" / "engine" / "numpy_vs_torch.json"


class TorchModel:
    """The forward of rackserve.model.transformer in torch ops (float32, CPU)."""

    def __init__(
        self, cfg: ModelConfig, w: ModelWeights, engram: LocalEngramTable, model: Transformer
    ):
        t = torch.from_numpy
        self.cfg, self.w = cfg, w
        self.layers = [
            {
                name: (t(getattr(layer, name)) if name != "engram" else layer.engram)
                for name in layer.__dataclass_fields__
            }
            for layer in w.layers
        ]
        for layer in self.layers:
            if layer["engram"] is not None:
                layer["engram"] = (t(layer["engram"].w_key), t(layer["engram"].w_value))
        self.embed, self.lm_head = t(w.embed), t(w.lm_head)
        self.lm_bias, self.final_norm = t(w.lm_bias), t(w.final_norm)
        self.tables = [t(engram.rows(i, 0, engram.num_rows)) for i in range(NUM_TABLES)]
        self.cos, self.sin = t(model.cos), t(model.sin)
        self.scale = float(model.scale)

    def rms(self, x: torch.Tensor, w: torch.Tensor | float) -> torch.Tensor:
        return x / torch.sqrt(x.square().mean(-1, keepdim=True) + self.cfg.norm_eps) * w

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        half = self.cfg.head_dim // 2
        cos, sin = self.cos[pos], self.sin[pos]
        if x.dim() == 3:
            cos, sin = cos[:, None], sin[:, None]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    @staticmethod
    def swiglu(h: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        a = h @ w13
        g, u = a.chunk(2, -1)
        return (torch.nn.functional.silu(g) * u) @ w2

    def moe(self, lw: dict, h: torch.Tensor) -> torch.Tensor:
        k = self.cfg.top_k
        logits = h @ lw["router"]
        top_logits, top = logits.topk(k, dim=1)
        scores = torch.sqrt(torch.nn.functional.softplus(top_logits))
        weights = scores / scores.sum(1, keepdim=True) * self.cfg.routed_scale
        out = self.swiglu(h, lw["shared_w13"], lw["shared_w2"])
        flat = top.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.cfg.n_experts).tolist()
        routed = torch.empty(len(flat), self.cfg.d_model)
        start = 0
        for e, c in enumerate(counts):
            if c:
                slots = order[start : start + c]
                start += c
                y = self.swiglu(h[slots // k], lw["experts_w13"][e], lw["experts_w2"][e])
                routed[slots] = y * weights.reshape(-1)[slots, None]
        return out + routed.view(len(h), k, -1).sum(1)

    def forward(self, kk: torch.Tensor, vv: torch.Tensor, segs: list[Segment]) -> torch.Tensor:
        cfg, bs, hd = self.cfg, self.cfg.block_size, self.cfg.head_dim
        tokens = torch.from_numpy(np.concatenate([s.token_ids for s in segs]))
        pos = torch.from_numpy(np.concatenate([np.arange(s.start, s.end) for s in segs]))
        rows = torch.from_numpy(np.concatenate([s.engram_rows for s in segs]))
        slots = torch.from_numpy(
            np.concatenate(
                [
                    s.block_table[np.arange(s.start, s.end) // bs] * bs
                    + np.arange(s.start, s.end) % bs
                    for s in segs
                ]
            )
        )
        emb = [tab[rows].reshape(len(tokens), -1) for tab in self.tables]
        decode = all(len(s.token_ids) == 1 for s in segs)
        if decode:
            lengths = torch.tensor([s.end for s in segs])
            nb = int(-(-lengths.max() // bs))
            tables = torch.zeros(len(segs), nb, dtype=torch.long)
            for i, s in enumerate(segs):
                n = -(-s.end // bs)
                tables[i, :n] = torch.from_numpy(s.block_table[:n])
            pad = torch.arange(nb * bs)[None, :] >= lengths[:, None]
            bias = (
                torch.zeros(pad.shape).masked_fill(pad, float("-inf"))[:, None, :]
                if pad.any()
                else None
            )
        x = self.embed[tokens]
        for li, lw in enumerate(self.layers):
            if lw["engram"] is not None:
                wk, wv = lw["engram"]
                e = emb[cfg.engram_layers.index(li)]
                key = self.rms(e @ wk, 1.0)
                gate = torch.sigmoid(
                    (self.rms(x, 1.0) * key).sum(-1, keepdim=True) / cfg.d_model**0.5
                )
                x = x + gate * (e @ wv)
            h = self.rms(x, lw["attn_norm"])
            q = self.rope((h @ lw["wq"]).view(len(x), cfg.n_q_heads, hd), pos)
            kvn = h @ lw["wkv"]
            kk[li].view(-1, hd)[slots] = self.rope(kvn[:, :hd], pos)
            vv[li].view(-1, hd)[slots] = kvn[:, hd:]
            if decode:
                keys = kk[li][tables].view(len(segs), -1, hd)
                vals = vv[li][tables].view(len(segs), -1, hd)
                s = (q * self.scale) @ keys.transpose(1, 2)
                s = s if bias is None else s + bias
                att = torch.softmax(s, -1) @ vals
            else:
                att = self.prefill_attention(kk[li], vv[li], q, segs[0])
            x = x + att.reshape(len(x), -1) @ lw["wo"]
            x = x + self.moe(lw, self.rms(x, lw["ffn_norm"]))
        last = torch.tensor(np.cumsum([len(s.token_ids) for s in segs]) - 1)
        return self.rms(x[last], self.final_norm) @ self.lm_head + self.lm_bias

    def prefill_attention(self, kc: torch.Tensor, vc: torch.Tensor, q: torch.Tensor, seg: Segment):
        hd, heads = self.cfg.head_dim, self.cfg.n_q_heads
        nb = -(-seg.end // self.cfg.block_size)
        table = torch.from_numpy(seg.block_table[:nb])
        keys, vals = kc[table].view(-1, hd), vc[table].view(-1, hd)
        out = torch.empty_like(q)
        q = q * self.scale
        step = query_tile(seg.end, heads)
        for lo in range(0, len(q), step):
            hi = min(lo + step, len(q))
            first, visible = seg.start + lo, seg.start + hi
            s = (q[lo:hi].reshape(-1, hd) @ keys[:visible].T).view(hi - lo, heads, visible)
            pos = torch.arange(first, visible)
            future = pos[None, :] > pos[:, None]  # only the tile's diagonal block, as in numpy
            s[:, :, first:] += torch.zeros(future.shape).masked_fill(future, float("-inf"))[
                :, None, :
            ]
            p = torch.softmax(s, -1).view(-1, visible)
            out[lo:hi] = (p @ vals[:visible]).view(hi - lo, heads, hd)
        return out


@dataclass(frozen=True)
class Timing:
    """Median seconds per call: wall clock, and CPU time of this process (all its threads)."""

    wall_s: float
    cpu_s: float


def paired_medians(numpy_fn, torch_fn, reps: int) -> tuple[Timing, Timing]:
    """Time both alternately, so load changes on a shared machine hit both alike. CPU time is
    also kept: with one thread it is the compute cost, without the time spent descheduled."""
    numpy_fn(), torch_fn()  # warm-up
    samples: tuple[list[tuple[float, float]], ...] = ([], [])
    for _ in range(reps):
        for fn, out in ((numpy_fn, samples[0]), (torch_fn, samples[1])):
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            out.append((time.perf_counter() - wall, time.process_time() - cpu))
    return tuple(
        Timing(statistics.median(w for w, _ in s), statistics.median(c for _, c in s))
        for s in samples
    )


def prefill_case(cfg, model, tmodel, n, reps):
    tokens = np.random.default_rng(n).integers(0, 256, n)
    nb = -(-n // cfg.block_size)
    seg = Segment(tokens, 0, np.arange(nb), engram_row_ids(tokens, cfg))
    kv = PagedKV(cfg.n_layers, nb, cfg.block_size, cfg.head_dim)
    kk, vv = torch.from_numpy(kv.k.copy()), torch.from_numpy(kv.v.copy())
    ref, got = model.forward(kv, [seg]), tmodel.forward(kk, vv, [seg]).numpy()
    diff = float(np.abs(ref - got).max() / np.abs(ref).max())
    s_np, s_t = paired_medians(
        lambda: model.forward(kv, [seg]), lambda: tmodel.forward(kk, vv, [seg]), reps
    )
    return n, s_np, s_t, diff


def decode_case(cfg, model, tmodel, batch, context, reps):
    per_seq = -(-context // cfg.block_size)
    kv = PagedKV(cfg.n_layers, batch * per_seq, cfg.block_size, cfg.head_dim)
    rng = np.random.default_rng(batch)
    kv.k[:] = rng.standard_normal(kv.k.shape, dtype=np.float32)
    kv.v[:] = rng.standard_normal(kv.v.shape, dtype=np.float32)
    kk, vv = torch.from_numpy(kv.k.copy()), torch.from_numpy(kv.v.copy())
    tokens = rng.integers(0, 256, (batch, 4))
    segs = [
        Segment(
            tokens[b, -1:],
            context - 1,
            np.arange(b * per_seq, (b + 1) * per_seq),
            engram_row_ids(tokens[b], cfg)[-1:],
        )
        for b in range(batch)
    ]
    ref, got = model.forward(kv, segs), tmodel.forward(kk, vv, segs).numpy()
    diff = float(np.abs(ref - got).max() / np.abs(ref).max())
    s_np, s_t = paired_medians(
        lambda: model.forward(kv, segs), lambda: tmodel.forward(kk, vv, segs), reps
    )
    return batch, s_np, s_t, diff


def _row(case: str, tokens: int, numpy_t: Timing, torch_t: Timing, diff: float) -> dict:
    return {
        "case": case,
        "tokens": tokens,
        "numpy_tok_s": tokens / numpy_t.cpu_s,
        "torch_tok_s": tokens / torch_t.cpu_s,
        "ratio_cpu": torch_t.cpu_s / numpy_t.cpu_s,
        "numpy_tok_s_wall": tokens / numpy_t.wall_s,
        "torch_tok_s_wall": tokens / torch_t.wall_s,
        "ratio_wall": torch_t.wall_s / numpy_t.wall_s,
        "max_rel_logit_diff": diff,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--threads", type=int, default=1, help="BLAS / torch intra-op threads for both"
    )
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    threadpool_limits(limits=args.threads, user_api="blas")
    cfg = ModelConfig()
    weights, table = init_weights(cfg), LocalEngramTable(cfg)
    model = Transformer(cfg, weights, table)
    tmodel = TorchModel(cfg, weights, table, model)
    rows = []
    load_before = os.getloadavg()[0]
    with torch.inference_mode():
        for n in (512, 4096):
            reps = args.reps if n <= 512 else max(3, args.reps // 2)
            rows.append(_row(f"prefill {n} tok", n, *prefill_case(cfg, model, tmodel, n, reps)[1:]))
        for batch in (1, 8, 64):
            case = decode_case(cfg, model, tmodel, batch, 512, args.reps * 3)
            rows.append(_row(f"decode batch {batch} @ctx 512", batch, *case[1:]))
    report = {
        "command": f".venv/bin/python bench/engine/numpy_vs_torch.py --threads {args.threads} --reps {args.reps}",
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, nproc shared",
        "threads": args.threads,
        "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]},
        "cpus": os.cpu_count(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "model": {
            k: getattr(cfg, k)
            for k in (
                "d_model",
                "n_layers",
                "n_q_heads",
                "head_dim",
                "n_experts",
                "top_k",
                "expert_hidden",
                "block_size",
            )
        },
        "goal": "numpy >= 0.8x torch at every size",
        "goal_met_cpu_time": all(r["ratio_cpu"] >= 0.8 for r in rows),
        "goal_met_wall_clock": all(r["ratio_wall"] >= 0.8 for r in rows),
        "note": "tok/s from the median CPU time of the process (1 thread: compute without the time "
        "descheduled on a shared machine); *_wall fields use wall-clock medians",
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    table = Table(title=f"small MoE forward, {args.threads} thread(s), medians of paired reps")
    for col in (
        "case",
        "numpy tok/s",
        "torch tok/s",
        "numpy/torch (cpu)",
        "(wall)",
        "max rel diff",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["case"],
            f"{r['numpy_tok_s']:,.0f}",
            f"{r['torch_tok_s']:,.0f}",
            f"{r['ratio_cpu']:.2f}x",
            f"{r['ratio_wall']:.2f}x",
            f"{r['max_rel_logit_diff']:.1e}",
        )
    Console().print(table)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
