"""The attention part of a layer's cost: attention over each sequence's KV, the indexer scan, the
projections, mHC residual traffic, TP all-reduces, LM head and the exposed Engram fetch."""

from __future__ import annotations

import numpy as np

from rackserve.timing import comm
from rackserve.timing.batch_features import GroupArrays
from rackserve.timing.cost_context import CostContext, LayerGroups
from rackserve.timing.engram_placement import fetch_time
from rackserve.timing.layout import Layout
from rackserve.timing.parts import ATTN_PART, MOE_PART, Parts
from rackserve.timing.roofline import attention_time, copy_time, domain_bw_factor, gemm_time

# Prefill attention kernels (FlashAttention-2, FlashMLA's prefill) compute a tile of query rows against
# each K/V block loaded once into shared memory: 128 query rows per tile (Dao 2023, "FlashAttention-2",
# sec. 3.1: block sizes {64, 128}; FlashMLA's SM90/SM100 prefill kernels tile 128 or 64 x 2 queries). So
# the window and densely attended entries are read once per 128 queries, not once per query; entries an
# indexer picks differ from query to query and are read per query.
PREFILL_QUERY_TILE = 128


def prefill_read_share(phase: str) -> float:
    """Share of the per-query KV entries a prefill step reads from HBM (1 in decode: each query its own)."""
    return 1.0 / PREFILL_QUERY_TILE if phase == "prefill" else 1.0


def kv_attention(
    ctx: CostContext,
    lay: Layout,
    phase: str,
    lg: LayerGroups,
    gi: int,
    ga: GroupArrays,
    parts: Parts,
) -> None:
    """Attention over each sequence's window and selected/compressed KV, and the indexer scan. FLOPs
    are per query; in decode the KV bytes are each sequence's entries once (a verify block's
    positions share them: batch_features.GroupSums.window_reads / comp_reads)."""
    hw, m, o = ctx.hw, ctx.model, ctx.opts
    att = m.attention
    counts = lg.code_counts[gi]
    win = ga.window_entries[:, None]
    comp = ga.comp_entries
    flops = (win + comp) * att.flops_per_entry(phase, lay.tp)
    if phase == "decode":
        bytes_ = ga.window_reads[:, None] * att.window_entry_bytes + ga.comp_reads * att.compressed_entry_bytes
    else:  # a query tile reads its window and dense entries once; indexer-chosen entries per query
        share = prefill_read_share(phase)
        dense = np.array([share if not c.indexer else 1.0 for c in ctx.codes])
        bytes_ = win * (att.window_entry_bytes * share) + comp * dense * att.compressed_entry_bytes
    overlap = 1.0 if o.attn_overlap else hw.efficiency.attention_overlap
    t, tc, tm = attention_time(
        hw,
        flops,
        bytes_,
        math_dtype=att.math_dtype,
        overlap=overlap,
        domain=domain_bw_factor(hw, False),
    )
    if phase == "decode" and not o.kv_gather_ahead:
        t = t + hw.microarch.gather_latency_s * (ga.seqs > 0)[:, None] * ctx.indexer_codes
    parts.add("attention", t @ counts, tc @ counts, tm @ counts)
    if m.indexer and lg.indexer_layers[gi]:
        ix = m.indexer
        dt = "fp4" if o.fp4_indexer else "fp8"
        it, itc, itm = attention_time(
            hw,
            ga.scan_entries * (2.0 * (ix.heads / lay.tp) * ix.head_dim),
            ga.key_reads * ix.key_bytes + ga.scan_entries * ix.score_bytes,
            math_dtype=dt,
            overlap=1.0,
        )
        parts.add("indexer", it @ counts, itc @ counts, itm @ counts)


def token_attention(
    ctx: CostContext,
    lay: Layout,
    phase: str,
    lg: LayerGroups,
    gi: int,
    tokens: np.ndarray,
    parts: Parts,
) -> None:
    """Projections (attention + indexer), mHC residual traffic and the TP all-reduces."""
    hw, m, o = ctx.hw, ctx.model, ctx.opts
    split_k = o.split_k
    layers = lg.layers[gi]
    n, k, groups, times = projections(ctx, lay.tp, lg, gi)
    # dense attention weights are not in REFERENCE's domain-local list: interleaved over both domains
    t, tc, tm = gemm_time(  # every projection at once: [matrices, ranks]
        hw,
        tokens[None, :],
        n,
        k,
        weight_dtype=m.dense_dtype,
        groups=groups,
        cluster_split_k=split_k,
        domain=domain_bw_factor(hw, False),
    )
    parts.add("attn_proj", (t * times).sum(0), (tc * times).sum(0), (tm * times).sum(0))
    if m.mhc:
        fused = o.fused_ar_mhc and lay.tp > 1
        passes = max(1, m.mhc.passes_per_sublayer - 2) if fused else m.mhc.passes_per_sublayer
        mbytes = tokens * m.mhc.streams * m.hidden * m.mhc.elem_bytes * passes * 2
        kernels = 0 if fused else 2
        mt = copy_time(
            hw, mbytes, domain_bw_factor(hw, o.domain_local)
        ) + kernels * hw.microarch.kernel_overhead_s * (tokens > 0)
        parts.add("mhc", mt, None, mt, times=layers)
    if lay.tp > 1:
        ar = np.array(
            [
                comm.tp_allreduce_time(
                    hw, x * m.hidden * 2.0, lay.tp, lay.trays, o.oneshot_allreduce
                )
                for x in tokens
            ]
        )
        parts.add("all_reduce", ar, times=2 * layers)


def projections(ctx: CostContext, tp: int, lg: LayerGroups, gi: int):
    """(n, k, groups, layers) columns [matrices, 1] of the attention (and, where the group has
    indexer layers, indexer) projections, each matrix's share of one rank under TP (cached)."""
    key = ("projections", tp, lg.layers, gi, lg.indexer_layers)
    hit = ctx.memo.get(key)
    if hit is not None:
        return hit
    m = ctx.model
    mats = [(mat, lg.layers[gi]) for mat in m.attention.matrices]
    if m.indexer and lg.indexer_layers[gi]:
        mats += [(mat, lg.indexer_layers[gi]) for mat in m.indexer.matrices]
    rows = []
    for mat, layers in mats:
        n, groups = mat.n, mat.groups
        if mat.tp_split and tp > 1:
            if groups >= tp:
                groups //= tp
            else:
                n //= tp
        rows.append((n, mat.k, groups, layers))
    cols = np.array(rows, dtype=np.int64).T[:, :, None]
    hit = ctx.memo[key] = (cols[0], cols[1], cols[2], cols[3].astype(np.float64))
    return hit


def lm_head(ctx, lay: Layout, phase: str, tokens, seqs, parts: Parts) -> None:
    """Logits of every decoded token, or of each prompt's last position in prefill."""
    m, o = ctx.model, ctx.opts
    rows = tokens if phase == "decode" else seqs
    t, tc, tm = gemm_time(
        ctx.hw,
        rows,
        m.vocab // lay.tp,
        m.hidden,
        weight_dtype=m.lm_head_dtype,
        cluster_split_k=o.split_k,
        domain=domain_bw_factor(ctx.hw, o.domain_local),
    )
    parts.add("lm_head", t, tc, tm)


def host_overhead(ctx, tokens: np.ndarray, parts: Parts) -> None:
    """The engine's per-step host work the GPU waits on (hw.step_overhead_s: scheduling, sampling,
    the step's graph launch), charged once per step on every rank with work."""
    if ctx.hw.step_overhead_s > 0.0:
        parts.add("host_overhead", ctx.hw.step_overhead_s * (tokens > 0))


def engram(ctx, lg: LayerGroups, gi: int, tokens: np.ndarray, parts: Parts) -> None:
    """Engram rows are fetched over NVLink from the GPUs holding the table shards (or, host-copy, over
    the CPU-GPU link from the host's copy: engram_placement.py), issued at step start (addressed by
    token ids alone), so only what outlasts the layers before it is exposed.
    The layers before it are timed by their token-count components (attention over the context is
    left out, so the exposure is, if anything, over-estimated), which keeps this memoizable."""
    m, hw = ctx.model, ctx.hw
    layers = [layer for group, layer in lg.engram if group == gi]
    if not m.engram or not layers:
        return
    per_layer = (parts.total(ATTN_PART) + parts.total(MOE_PART)) / m.layers
    fetch = fetch_time(hw, tokens * (m.engram.rows_per_token * m.engram.row_bytes), ctx.engram_placement)
    total = parts.zero
    for layer in layers:
        exposed = np.maximum(0.0, fetch - layer * per_layer) + hw.microarch.kernel_overhead_s
        total = total + exposed * (tokens > 0)
    parts.add("engram", total)
