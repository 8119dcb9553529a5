"""Measure, on one real GPU, the kernels DeepSeek-V4.1-Flash uses at the shapes it uses.

Self-contained (torch + numpy only): runs on the device machine as
    python3 bench/calibrate/h200_kernels.py --out $OUT/h200_raw.json
Every measurement: CUDA-graph replay of a loop of calls that cycles through enough copies of the
operands to defeat the 60 MB L2 (as a real step streams a different layer's weights each call),
timed with CUDA events, warm-up first, median of repeats. Writes one JSON with the raw times.
Kinds: gemm (dense BF16 / FP8 at model shapes), bmm (grouped output projection), grouped (expert
GEMMs at prefill and decode tokens-per-expert), attention (MQA decode, 64 heads, one shared 512-dim
K=V head), copy (device-to-device bandwidth).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import traceback

import torch

L2_DEFEAT_BYTES = 512 * 1024**2  # cycle operand copies until this many bytes are touched per loop
MAX_COPIES = 48
TARGET_LOOP_S = 2e-3
REPEATS = 7

# (name, K, N, groups): the model's dense projections (see rackserve/timing/specs/model/deepseek-v4.1-flash.yaml)
DENSE = [
    ("wq_a", 5120, 1280),
    ("wq_b", 1280, 32768),
    ("wkv", 5120, 512),
    ("wo_b", 8192, 5120),
    ("wq_idx", 1280, 4096),
    ("shared_up", 5120, 4608),
    ("shared_down", 2304, 5120),
    ("gate", 5120, 384),
    ("lm_head", 5120, 129280),
]
DENSE_M = [1, 8, 32, 128, 512, 2048, 8192]
GROUPED_EXPERTS = [48, 192]  # experts per rank: wide-EP 8 and DEP2 slices of 384
GROUPED_TPE = [1, 4, 16, 64, 256, 1024]  # tokens per expert: decode .. prefill
ATTN_B = [1, 8, 32, 128]
ATTN_C = [1024, 4096, 16384, 65536]
COPY_BYTES = [2**26, 2**27, 2**28, 2**29, 2**30, 2**31, 2**32]


def timed(fn_for_copy, copies: int) -> tuple[float, str]:
    """Median seconds per call of fn_for_copy(i) cycling i over copies, via CUDA graph when possible."""
    torch.cuda.synchronize()
    for i in range(min(copies, 3)):
        fn_for_copy(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn_for_copy(0)
    torch.cuda.synchronize()
    est = max(time.perf_counter() - t0, 2e-6)
    n = int(min(200, max(copies, math.ceil(TARGET_LOOP_S / est))))
    n = max(1, n)

    def loop() -> None:
        for j in range(n):
            fn_for_copy(j % copies)

    mode = "graph"
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            loop()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            loop()
        run = graph.replay
    except Exception:  # noqa: BLE001 - some ops refuse capture; fall back to eager timing
        mode = "eager"
        run = loop
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / n)
    return statistics.median(times), mode


def n_copies(bytes_per_call: float) -> int:
    return int(min(MAX_COPIES, max(1, math.ceil(L2_DEFEAT_BYTES / max(bytes_per_call, 1)))))


def measure_gemm(dtype: str, name: str, m: int, k: int, n: int) -> dict:
    dev = "cuda"
    wbytes = k * n * (1 if dtype == "fp8" else 2)
    copies = n_copies(wbytes + m * k * 2)
    if dtype == "bf16":
        xs = [torch.randn(m, k, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
        ws = [torch.randn(k, n, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        outs = [torch.empty(m, n, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
        t, mode = timed(lambda i: torch.mm(xs[i], ws[i], out=outs[i]), copies)
    else:
        f8 = torch.float8_e4m3fn
        xs = [torch.randn(m, k, device=dev).to(f8) for _ in range(copies)]
        # _scaled_mm wants the second operand column-major: transpose of a row-major (n, k)
        ws = [torch.randn(n, k, device=dev).mul(0.02).to(f8).t() for _ in range(copies)]
        one = torch.ones((), device=dev)
        t, mode = timed(
            lambda i: torch._scaled_mm(
                xs[i], ws[i], scale_a=one, scale_b=one, out_dtype=torch.bfloat16
            ),
            copies,
        )
    return {
        "kind": "gemm",
        "dtype": dtype,
        "name": name,
        "m": m,
        "n": n,
        "k": k,
        "groups": 1,
        "time_s": t,
        "mode": mode,
    }


def measure_bmm(m: int) -> dict:
    g, k, n = 8, 4096, 1024  # grouped output projection wo_a
    copies = n_copies(g * k * n * 2)
    xs = [torch.randn(g, m, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    ws = [torch.randn(g, k, n, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    t, mode = timed(lambda i: torch.bmm(xs[i], ws[i]), copies)
    return {
        "kind": "gemm",
        "dtype": "bf16",
        "name": "wo_a",
        "m": m,
        "n": n,
        "k": k,
        "groups": g,
        "time_s": t,
        "mode": mode,
    }


def measure_grouped(experts: int, tpe: int, k: int, n: int, name: str) -> dict:
    tokens = experts * tpe
    a = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    copies = n_copies(experts * k * n * 2)
    bs = [
        torch.randn(experts, k, n, device="cuda", dtype=torch.bfloat16) * 0.02
        for _ in range(copies)
    ]
    offs = torch.arange(1, experts + 1, device="cuda", dtype=torch.int32) * tpe
    impl = "torch._grouped_mm"
    try:
        t, mode = timed(lambda i: torch._grouped_mm(a, bs[i], offs=offs), copies)
    except Exception:  # noqa: BLE001 - older torch: batched matmul over equal groups
        impl = "torch.bmm"
        a3 = a.view(experts, tpe, k)
        t, mode = timed(lambda i: torch.bmm(a3, bs[i]), copies)
    return {
        "kind": "grouped",
        "dtype": "bf16",
        "name": name,
        "experts": experts,
        "tokens_per_expert": tpe,
        "k": k,
        "n": n,
        "time_s": t,
        "mode": mode,
        "impl": impl,
    }


def measure_attention(b: int, c: int, impl: str) -> dict:
    heads, d = 64, 512
    kv_bytes = b * c * d * 2
    copies = n_copies(kv_bytes)
    qs = [torch.randn(b, heads, 1, d, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    kvs = [torch.randn(b, 1, c, d, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    scale = 1.0 / math.sqrt(d)
    if impl == "sdpa":

        def call(i: int):
            kv = kvs[i].expand(b, heads, c, d)
            return torch.nn.functional.scaled_dot_product_attention(qs[i], kv, kv, scale=scale)
    else:  # MQA as two batched GEMMs: 64 heads are the M rows of one shared K=V head

        def call(i: int):
            q = qs[i].view(b, heads, d)
            kv = kvs[i].view(b, c, d)
            p = torch.softmax(torch.bmm(q, kv.transpose(1, 2)).float() * scale, dim=-1).to(
                torch.bfloat16
            )
            return torch.bmm(p, kv)

    t, mode = timed(call, copies)
    return {
        "kind": "attention",
        "impl": impl,
        "batch": b,
        "context": c,
        "heads": heads,
        "head_dim": d,
        "kv_dtype": "bf16",
        "time_s": t,
        "mode": mode,
    }


def _triton_mqa():
    """A fused split-KV MQA decode kernel: 64 query heads share one 512-dim K=V head (Triton)."""
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(
        Q,
        KV,
        Out,
        M,
        L,
        C,
        chunk,
        s_qb,
        s_kvb,
        s_kvc,
        s_ob,
        s_os,
        s_mb,
        s_ms,
        scale,
        H: tl.constexpr,
        D: tl.constexpr,
        DV: tl.constexpr,
        BN: tl.constexpr,
    ):
        b = tl.program_id(0)
        s = tl.program_id(1)
        dvi = tl.program_id(2)
        oh = tl.arange(0, H)
        od = tl.arange(0, D)
        odv = dvi * DV + tl.arange(0, DV)
        on = tl.arange(0, BN)
        q = tl.load(Q + b * s_qb + oh[:, None] * D + od[None, :])
        m_i = tl.full([H], float("-inf"), tl.float32)
        l_i = tl.zeros([H], tl.float32)
        acc = tl.zeros([H, DV], tl.float32)
        start = s * chunk
        end = tl.minimum(start + chunk, C)
        for n0 in range(start, end, BN):
            n = n0 + on
            mask = n < end
            k = tl.load(
                KV + b * s_kvb + n[:, None] * s_kvc + od[None, :], mask=mask[:, None], other=0.0
            )
            qk = tl.dot(q, tl.trans(k)) * scale
            qk = tl.where(mask[None, :], qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            p = tl.exp(qk - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(
                KV + b * s_kvb + n[:, None] * s_kvc + odv[None, :], mask=mask[:, None], other=0.0
            )
            acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v)
            m_i = m_new
        tl.store(Out + b * s_ob + s * s_os + oh[:, None] * D + odv[None, :], acc)
        if dvi == 0:
            tl.store(M + b * s_mb + s * s_ms + oh, m_i)
            tl.store(L + b * s_mb + s * s_ms + oh, l_i)

    return kernel


_TRITON = {}


def mqa_decode_triton(q, kv, bn: int, warps: int, stages: int, dv: int = 256):
    """q [B, 64, 512], kv [B, C, 512] (bf16) -> [B, 64, 512] fp32: split-KV kernel + torch combine."""
    if "k" not in _TRITON:
        _TRITON["k"] = _triton_mqa()
    b, h, d = q.shape
    c = kv.shape[1]
    splits = max(1, min(c // bn, math.ceil(2 * 132 / (b * (d // dv)))))
    chunk = math.ceil(c / splits / bn) * bn
    splits = math.ceil(c / chunk)
    o = torch.empty(b, splits, h, d, device=q.device, dtype=torch.float32)
    m = torch.empty(b, splits, h, device=q.device, dtype=torch.float32)
    lse = torch.empty_like(m)
    _TRITON["k"][(b, splits, d // dv)](
        q,
        kv,
        o,
        m,
        lse,
        c,
        chunk,
        q.stride(0),
        kv.stride(0),
        kv.stride(1),
        o.stride(0),
        o.stride(1),
        m.stride(0),
        m.stride(1),
        1.0 / math.sqrt(d),
        H=h,
        D=d,
        DV=dv,
        BN=bn,
        num_warps=warps,
        num_stages=stages,
    )
    w = torch.exp(m - m.amax(dim=1, keepdim=True))
    return (o * w[..., None]).sum(1) / (lse * w).sum(1)[..., None]


TRITON_CONFIGS = [(32, 8, 2), (16, 8, 2), (16, 4, 1)]


def measure_attention_triton(b: int, c: int) -> dict:
    heads, d = 64, 512
    copies = n_copies(b * c * d * 2)
    qs = [torch.randn(b, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    kvs = [torch.randn(b, c, d, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    ref = (
        torch.softmax(torch.bmm(qs[0], kvs[0].transpose(1, 2)).float() / math.sqrt(d), -1)
        @ kvs[0].float()
    )
    errors = []
    for bn, warps, stages in TRITON_CONFIGS:
        try:
            out = mqa_decode_triton(qs[0], kvs[0], bn, warps, stages)
            err = float((out - ref).abs().max())
            if not err < 2e-2:
                raise ValueError(f"wrong result, max abs err {err}")
            t, mode = timed(
                lambda i, c=(bn, warps, stages): mqa_decode_triton(qs[i], kvs[i], *c), copies
            )
            return {
                "kind": "attention",
                "impl": "triton",
                "batch": b,
                "context": c,
                "heads": heads,
                "head_dim": d,
                "kv_dtype": "bf16",
                "time_s": t,
                "mode": mode,
                "config": [bn, warps, stages],
                "max_abs_err": err,
            }
        except Exception as exc:  # noqa: BLE001 - try the next (smaller) tile config
            errors.append(f"{(bn, warps, stages)}: {type(exc).__name__}: {exc}"[:200])
    raise RuntimeError("; ".join(errors))


def measure_grouped_fp8(experts: int, tpe: int, k: int, n: int, name: str) -> dict:
    tokens = experts * tpe
    f8 = torch.float8_e4m3fn
    a = torch.randn(tokens, k, device="cuda").to(f8)
    copies = n_copies(experts * k * n)
    # second operand column-major per group: transpose of a row-major (G, n, k)
    bs = [
        torch.randn(experts, n, k, device="cuda").mul(0.02).to(f8).transpose(1, 2)
        for _ in range(copies)
    ]
    sa = torch.ones(tokens, device="cuda", dtype=torch.float32)
    sb = torch.ones(experts, n, device="cuda", dtype=torch.float32)
    offs = torch.arange(1, experts + 1, device="cuda", dtype=torch.int32) * tpe
    t, mode = timed(
        lambda i: torch._scaled_grouped_mm(a, bs[i], sa, sb, offs=offs, out_dtype=torch.bfloat16),
        copies,
    )
    return {
        "kind": "grouped",
        "dtype": "fp8",
        "name": name,
        "experts": experts,
        "tokens_per_expert": tpe,
        "k": k,
        "n": n,
        "time_s": t,
        "mode": mode,
        "impl": "torch._scaled_grouped_mm",
    }


def measure_copy(nbytes: int) -> dict:
    src = torch.empty(nbytes // 2, device="cuda", dtype=torch.bfloat16).normal_()
    dst = torch.empty_like(src)
    t, mode = timed(lambda i: dst.copy_(src), 1)
    return {"kind": "copy", "bytes": nbytes, "bytes_moved": 2 * nbytes, "time_s": t, "mode": mode}


def plan_extra() -> list[tuple]:
    """Second call: fused attention (Triton), FP8 grouped GEMMs, more copy sizes."""
    jobs: list[tuple] = []
    for b in ATTN_B:
        for c in ATTN_C:
            if b * c <= 128 * 16384:
                jobs.append((measure_attention_triton, b, c))
    for e in GROUPED_EXPERTS:
        for tpe in GROUPED_TPE:
            jobs.append((measure_grouped_fp8, e, tpe, 5120, 4608, "expert_up"))
            jobs.append((measure_grouped_fp8, e, tpe, 2304, 5120, "expert_down"))
    jobs += [(measure_copy, nb) for nb in COPY_BYTES]
    return jobs


def plan(quick: bool) -> list[tuple]:
    jobs: list[tuple] = []
    ms = DENSE_M[:3] if quick else DENSE_M
    for dtype in ("bf16", "fp8"):
        for name, k, n in DENSE:
            for m in ms:
                if name == "lm_head" and m > 2048:
                    continue
                jobs.append((measure_gemm, dtype, name, m, k, n))
    jobs += [(measure_bmm, m) for m in ms]
    for e in GROUPED_EXPERTS:
        for tpe in GROUPED_TPE[: 2 if quick else None]:
            jobs.append((measure_grouped, e, tpe, 5120, 4608, "expert_up"))
            jobs.append((measure_grouped, e, tpe, 2304, 5120, "expert_down"))
    for impl in ("sdpa", "bmm"):
        for b in ATTN_B[: 2 if quick else None]:
            for c in ATTN_C:
                if b * c > 128 * 16384:
                    continue
                jobs.append((measure_attention, b, c, impl))
    jobs += [(measure_copy, nb) for nb in COPY_BYTES[: 2 if quick else None]]
    return jobs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--extra",
        action="store_true",
        help="only the second-call set (Triton attention, FP8 grouped, copies)",
    )
    ap.add_argument(
        "--budget-s", type=float, default=420.0, help="stop starting new jobs after this long"
    )
    args = ap.parse_args()
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    result = {
        "device": props.name,
        "sm_count": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "method": __doc__,
        "measurements": [],
        "errors": [],
    }
    t_start = time.time()
    for job in plan_extra() if args.extra else plan(args.quick):
        fn, *params = job
        if time.time() - t_start > args.budget_s:
            result["errors"].append(
                {"job": [fn.__name__, *params], "error": "skipped: over --budget-s"}
            )
            continue
        try:
            rec = fn(*params)
            result["measurements"].append(rec)
            print(json.dumps(rec), flush=True)
        except Exception as exc:  # noqa: BLE001 - record and go on: one unsupported op must not lose the run
            err = {"job": [fn.__name__, *params], "error": f"{type(exc).__name__}: {exc}"[:400]}
            result["errors"].append(err)
            print("ERROR", json.dumps(err), traceback.format_exc(limit=1)[-300:], flush=True)
        torch.cuda.empty_cache()
        with open(args.out, "w") as f:  # keep what we have if the call is cut short
            json.dump(result, f)
    result["wall_s"] = time.time() - t_start
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(
        f"wrote {args.out}: {len(result['measurements'])} measurements, {len(result['errors'])} errors, {result['wall_s']:.0f}s"
    )


if __name__ == "__main__":
    main()
