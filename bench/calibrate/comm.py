"""Measure NCCL all-reduce and EP-shaped all-to-all on 1/2/4/8 GPUs of one host (issue 10).

Self-contained (torch + numpy): on the device machine
    python3 bench/calibrate/comm.py --out $OUT/comm_raw.json [--ranks 2,4,8] [--sanity]
--sanity runs the world-size-1 path only (what a single-GPU machine can check). NVLink multicast
(NVLS) stays off: NCCL_NVLS_ENABLE=0 is forced for every process (the device README says why).
All-reduce: BF16 messages 1 KB .. 64 MB, eager and inside a CUDA graph. All-to-all: dispatch
(FP8 token + scales, 5280 B) and combine (BF16, 10240 B) of tokens x top-6 of 384 experts spread
over the ranks, at decode and prefill token counts. Median of repeats, CUDA events on rank 0, after
a barrier. Then fits t = alpha + bytes / bw per collective and rank count (least squares) and
reports predicted vs measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

AR_BYTES = [2**p for p in range(10, 27, 2)]  # 1 KB .. 64 MB
A2A_TOKENS = [8, 32, 128, 512, 2048, 8192]  # per rank: decode .. prefill
HIDDEN, TOP_K, EXPERTS = 5120, 6, 384
DISPATCH_BYTES, COMBINE_BYTES = HIDDEN + HIDDEN // 128 * 4, HIDDEN * 2
REPEATS, INNER = 9, 20


def _time(fn, inner: int = INNER) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(REPEATS):
        dist.barrier()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(inner):
            fn()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e) / 1e3 / inner)
    return statistics.median(out)


def _graph_time(fn) -> float | None:
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(INNER):
                fn()
        return _time(g.replay, inner=1) / INNER
    except Exception:  # noqa: BLE001 - graph capture of NCCL may be refused; eager numbers stand
        return None


def _split_counts(tokens: int, world: int, rng: np.random.Generator) -> list[int]:
    """Token-copies rank 0 sends to each rank: top-6 distinct experts of 384, experts split evenly."""
    experts = np.argsort(rng.random((tokens, EXPERTS)), axis=1)[:, :TOP_K]
    dest = experts // (EXPERTS // world)
    return np.bincount(dest.ravel(), minlength=world).tolist()


def worker(rank: int, world: int, init: str, out_q) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world)
    recs = []
    for nbytes in AR_BYTES:
        x = torch.ones(nbytes // 2, device="cuda", dtype=torch.bfloat16)
        eager = _time(lambda x=x: dist.all_reduce(x))
        graph = _graph_time(lambda x=x: dist.all_reduce(x))
        if rank == 0:
            assert torch.allclose(
                x[:1].float(), x[:1].float()
            )  # values grow; correctness checked below
        recs.append(
            {
                "kind": "all_reduce",
                "world": world,
                "bytes": nbytes,
                "eager_s": eager,
                "graph_s": graph,
            }
        )
    y = torch.full((1024,), float(rank + 1), device="cuda")
    dist.all_reduce(y)
    ok = bool(torch.all(y == world * (world + 1) / 2).item())
    rng = np.random.default_rng(rank)
    for tokens in A2A_TOKENS:
        for phase, elem in (("dispatch", DISPATCH_BYTES), ("combine", COMBINE_BYTES)):
            send = _split_counts(tokens, world, rng)
            counts = torch.tensor(send, device="cuda")
            recv_counts = torch.empty_like(counts)
            dist.all_to_all_single(recv_counts, counts)
            recv = recv_counts.tolist()
            sbuf = torch.empty(sum(send) * elem, device="cuda", dtype=torch.uint8)
            rbuf = torch.empty(sum(recv) * elem, device="cuda", dtype=torch.uint8)
            ins, outs = [c * elem for c in send], [c * elem for c in recv]
            t = _time(lambda r=rbuf, s=sbuf, o=outs, i=ins: dist.all_to_all_single(r, s, o, i))
            remote = sum(c for i, c in enumerate(send) if i != rank) * elem
            recs.append(
                {
                    "kind": f"all_to_all_{phase}",
                    "world": world,
                    "tokens": tokens,
                    "bytes": remote,
                    "eager_s": t,
                }
            )
    dist.destroy_process_group()
    if rank == 0:
        out_q.put({"records": recs, "allreduce_correct": ok})


def run_world(world: int) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    init = f"file://{tempfile.mktemp(prefix='nccl_')}"
    procs = [ctx.Process(target=worker, args=(r, world, init, q)) for r in range(world)]
    for p in procs:
        p.start()
    res = q.get(timeout=600)
    for p in procs:
        p.join()
    return res


def fit(records: list[dict], key: str = "eager_s") -> list[dict]:
    """alpha (s) and bw (B/s) per (kind, world) from t = alpha + bytes / bw; held-out error = every 2nd."""
    out = []
    for kind, world in sorted({(r["kind"], r["world"]) for r in records}):
        rows = [r for r in records if r["kind"] == kind and r["world"] == world and r.get(key)]
        if len(rows) < 4 or world == 1:
            continue
        train, test = rows[::2], rows[1::2]
        a = np.array([[1.0, r["bytes"]] for r in train])
        sol, *_ = np.linalg.lstsq(a, np.array([r[key] for r in train]), rcond=None)
        alpha, inv_bw = float(max(sol[0], 0.0)), float(max(sol[1], 1e-15))
        err = [abs(alpha + r["bytes"] * inv_bw - r[key]) / r[key] * 100 for r in test]
        out.append(
            {
                "kind": kind,
                "world": world,
                "timing": key,
                "alpha_s": alpha,
                "bw_bytes_per_s": 1.0 / inv_bw,
                "heldout_median_abs_pct": float(np.median(err)),
                "heldout_worst_abs_pct": float(np.max(err)),
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--sanity", action="store_true", help="world size 1 only (single-GPU machine)")
    args = ap.parse_args()
    n_gpu = torch.cuda.device_count()
    worlds = [1] if args.sanity else [w for w in map(int, args.ranks.split(",")) if w <= n_gpu]
    result = {
        "gpus": n_gpu,
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "nccl_nvls_enable": os.environ["NCCL_NVLS_ENABLE"],
        "worlds": worlds,
        "records": [],
        "checks": {},
    }
    for w in worlds:
        res = run_world(w)
        result["records"] += res["records"]
        result["checks"][f"all_reduce_sum_world{w}"] = res["allreduce_correct"]
        print(
            f"world {w}: {len(res['records'])} records, all-reduce sum correct: {res['allreduce_correct']}",
            flush=True,
        )
    result["fits"] = fit(result["records"], "eager_s") + fit(result["records"], "graph_s")
    for f in result["fits"]:
        print(json.dumps(f))
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
