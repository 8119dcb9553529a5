"""Fit the h200 efficiency parameters of the cost model to real H200 kernel times, and report the
held-out error.

    .venv/bin/python bench/calibrate/fit.py [--raw bench/results/calibrate/h200_raw.json] [--write-spec]

Shapes are split deterministically: within each kernel family (sorted by shape) even positions train,
odd positions are held out. The fit minimises the mean squared log error of the roofline kernel
functions of rackserve/timing/roofline.py (the same ones the step cost uses) on the training half;
the table reports predicted vs measured on the held-out half. --write-spec writes the fitted values
into rackserve/timing/specs/hardware/h200.yaml; bench/results/calibrate/h200.json gets the error table.

Attention: torch has no fused decode kernel for a 512-dim head (SDPA falls back to its math path),
so the measured attention is the unfused path (QK bmm, softmax in FP32, PV bmm). It is predicted,
never fitted, from the fitted GEMM and streaming parameters; the fused-attention efficiency of the
h200 spec keeps its public starting value.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

from rackserve.timing.roofline import attention_time, copy_time, gemm_time, grouped_gemm_time
from rackserve.timing.spec import HardwareSpec, load_hardware

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "rackserve/timing/specs/hardware/h200.yaml"
# name -> (path in the spec, lower bound, upper bound)
PARAMS = {
    "gemm_compute_bf16": ("efficiency.gemm_compute.bf16", 0.3, 1.0),
    "gemm_compute_fp8": ("efficiency.gemm_compute.fp8", 0.3, 1.0),
    "gemm_memory": ("efficiency.gemm_memory", 0.3, 0.95),  # memory efficiencies capped at 0.95 of peak DRAM
    "hbm": ("efficiency.hbm", 0.2, 0.95),
    "kernel_overhead_s": ("microarch.kernel_overhead_s", 1e-7, 2e-5),
    "per_sm_bw_bytes_per_s": ("microarch.per_sm_bw_bytes_per_s", 5e9, 1e12),
}
# fitted separately on our Triton MQA decode kernel; reported, not written to the spec (see notes)
ATTENTION_PARAMS = {
    "attention_compute": ("efficiency.attention_compute", 0.01, 1.0),
    "attention_memory": ("efficiency.attention_memory", 0.01, 1.0),
}
COPY_MAX_BYTES = 256 * 1024**2


# REFERENCE's public starting points (and free-parameter starts), the fit's initial values
PUBLIC_STARTS = {
    "gemm_compute_bf16": 0.79, "gemm_compute_fp8": 0.73, "gemm_memory": 0.78,
    "hbm": 0.78, "kernel_overhead_s": 4.0e-6, "per_sm_bw_bytes_per_s": 1.0e11,
}


def with_params(hw: HardwareSpec, values: dict[str, float]) -> HardwareSpec:
    data = hw.model_dump()
    for name, value in values.items():
        node = data
        *path, leaf = {**PARAMS, **ATTENTION_PARAMS}[name][0].split(".")
        for part in path:
            node = node[part]
        node[leaf] = value
    return HardwareSpec.model_validate(data)


def family(r: dict) -> str:
    if r["kind"] == "gemm":
        return f"gemm_{r['dtype']}"
    if r["kind"] == "attention":
        return f"attention_{r['impl']}"
    if r["kind"] == "grouped":
        return f"grouped_{r.get('dtype', 'bf16')}"
    return r["kind"]


def predict_rows(hw: HardwareSpec, rows: list[dict]) -> np.ndarray:
    """Predicted seconds for each measurement (vectorized per kernel family)."""
    out = np.full(len(rows), np.nan)
    by: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by.setdefault(family(r), []).append(i)
    for fam, idx in by.items():
        out[idx] = _predict_family(hw, fam, [rows[i] for i in idx])
    return out


def _col(rows: list[dict], key: str) -> np.ndarray:
    return np.array([r[key] for r in rows], dtype=np.float64)


def _predict_family(hw: HardwareSpec, fam: str, rows: list[dict]) -> np.ndarray:
    if fam.startswith("gemm_"):
        dt = fam[5:]
        m, n, k, g = (_col(rows, x) for x in ("m", "n", "k", "groups"))
        return gemm_time(hw, m, n, k, weight_dtype=dt, math_dtype=dt, groups=g)[0]
    if fam.startswith("grouped_"):
        dt = fam[8:]
        e, tpe, n, k = (_col(rows, x) for x in ("experts", "tokens_per_expert", "n", "k"))
        wb = 1.0 if dt == "fp8" else 2.0
        return grouped_gemm_time(hw, e * tpe, e * k * n * wb, n, k, math_dtype=dt, act_bytes_per_row=k * wb + n * 2.0)[0]
    if fam == "attention_triton":
        b, c, h, d = (_col(rows, x) for x in ("batch", "context", "heads", "head_dim"))
        flops = 4.0 * h * d * b * c  # QK and PV over every cached position
        t = attention_time(hw, flops, b * c * d * 2.0, math_dtype="bf16", overlap=1.0)[0]
        return t + 6 * hw.microarch.kernel_overhead_s  # split-KV combine: 6 small torch kernels
    if fam == "copy":
        return copy_time(hw, _col(rows, "bytes_moved")) + hw.microarch.kernel_overhead_s
    if fam == "attention_bmm":
        b, c, h, d = (_col(rows, x) for x in ("batch", "context", "heads", "head_dim"))
        qk = gemm_time(hw, h, c, d, weight_dtype="bf16", groups=b)[
            0
        ]  # the shared K head is the "weight"
        pv = gemm_time(hw, h, d, c, weight_dtype="bf16", groups=b)[0]
        # .float(), * scale, softmax, .to(bf16): 4 streaming kernels over B x H x C scores (28 B per score)
        soft = copy_time(hw, b * h * c * 28.0) + 4 * hw.microarch.kernel_overhead_s
        return qk + pv + soft
    return np.full(len(rows), np.nan)


def _shape_group(r: dict) -> tuple:
    """Shapes of one kernel at one size axis: a GEMM matrix over M, experts over tokens per expert."""
    if r["kind"] == "gemm":
        return (r["name"],), r["m"]
    if r["kind"] == "grouped":
        return (r["name"], r["experts"]), r["tokens_per_expert"]
    if r["kind"] == "attention":
        return (r["batch"],), r["context"]
    return (), r.get("bytes", 0)


def split(measurements: list[dict]) -> tuple[list[dict], list[dict], list[dict]]:
    """(train, held-out, excluded). Within each kernel's size sweep, alternate sizes go to train and
    held-out (so every matrix is seen at some sizes and judged at others); unfused attention is
    only predicted; SDPA's math fallback (no fused kernel for head dim 512) is excluded."""
    train, test, excluded = [], [], []
    groups: dict[tuple, list[dict]] = {}
    for r in measurements:
        if family(r) == "attention_sdpa" or (r["kind"] == "copy" and r["bytes"] > COPY_MAX_BYTES):
            excluded.append(r)
            continue
        if r["kind"] == "grouped":  # grouped efficiencies: fit_expert_launch.py, fastest kernel
            excluded.append(r)
            continue
        key, _ = _shape_group(r)
        groups.setdefault((family(r), *key), []).append(r)
    for key, rows in sorted(groups.items(), key=lambda kv: str(kv[0])):
        rows = sorted(rows, key=lambda r: _shape_group(r)[1])
        if key[0] == "attention_bmm":
            test += rows
            continue
        first = len(train) % 2  # alternate which end starts in train, so both ends get judged
        train += rows[first::2]
        test += rows[1 - first :: 2]
    return train, test, excluded


def loss(hw: HardwareSpec, rows: list[dict], measured: np.ndarray) -> float:
    return float(np.mean(np.square(np.log(predict_rows(hw, rows) / measured))))


def nelder_mead(f, x0: np.ndarray, iters: int = 400, step: float = 0.15) -> np.ndarray:
    """Plain Nelder-Mead over unconstrained coordinates (numpy only)."""
    n = len(x0)
    pts = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        centroid = np.mean(pts[:-1], axis=0)
        refl = centroid + (centroid - pts[-1])
        fr = f(refl)
        if fr < vals[0]:
            exp = centroid + 2 * (centroid - pts[-1])
            fe = f(exp)
            pts[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = refl, fr
        else:
            con = centroid + 0.5 * (pts[-1] - centroid)
            fc = f(con)
            if fc < vals[-1]:
                pts[-1], vals[-1] = con, fc
            else:
                pts = [pts[0]] + [pts[0] + 0.5 * (p - pts[0]) for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    return pts[int(np.argmin(vals))]


def fit(hw0: HardwareSpec, train: list[dict], params: dict, start: dict[str, float]) -> dict[str, float]:
    names = list(params)
    lo = np.log([params[n][1] for n in names])
    hi = np.log([params[n][2] for n in names])

    def decode(z: np.ndarray) -> dict[str, float]:
        return dict(zip(names, np.exp(np.clip(z, lo, hi)).tolist(), strict=True))

    measured = _col(train, "time_s")

    def objective(z: np.ndarray) -> float:
        return loss(with_params(hw0, decode(z)), train, measured)

    z = np.log([start[n] for n in names])
    for _ in range(2):  # restarts shake Nelder-Mead out of a collapsed simplex
        z = nelder_mead(objective, z)
    return decode(z)


def table(hw: HardwareSpec, rows: list[dict]) -> list[dict]:
    out = []
    for r, p in zip(rows, predict_rows(hw, rows), strict=False):
        p = float(p)
        shape = {k: v for k, v in r.items() if k not in ("time_s", "mode", "kind")}
        out.append(
            {
                "family": family(r),
                "shape": shape,
                "measured_s": r["time_s"],
                "predicted_s": p,
                "error_pct": (p - r["time_s"]) / r["time_s"] * 100,
            }
        )
    return out


def summary(rows: list[dict]) -> dict:
    errs = np.abs([r["error_pct"] for r in rows])
    worst = rows[int(np.argmax(errs))]
    return {
        "n": len(rows),
        "median_abs_pct": float(np.median(errs)),
        "worst_abs_pct": float(errs.max()),
        "worst_case": {"family": worst["family"], "shape": worst["shape"]},
    }


def write_spec(values: dict[str, float], raw: str) -> None:
    text = SPEC.read_text()
    for name, value in values.items():
        leaf = PARAMS[name][0].split(".")[-1]
        note = f"CALIBRATED: bench/calibrate/fit.py on {raw} (see bench/results/calibrate/h200.json)"
        if name.startswith("gemm_compute_"):
            continue
        text, n = re.subn(
            rf"^(\s*{leaf}: )[^#\n]*#.*$", rf"\g<1>{value:.4g}  # {note}", text, count=1, flags=re.M
        )
        assert n == 1, name
    bf16, fp8 = values["gemm_compute_bf16"], values["gemm_compute_fp8"]
    text, n = re.subn(
        r"^(\s*gemm_compute: ).*$",
        rf"\g<1>{{bf16: {bf16:.4g}, fp8: {fp8:.4g}}}  # CALIBRATED: bench/calibrate/fit.py on {raw}",
        text,
        count=1,
        flags=re.M,
    )
    assert n == 1
    SPEC.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", nargs="+", default=["bench/results/calibrate/h200_raw.json", "bench/results/calibrate/h200_raw2.json"])
    ap.add_argument("--out", default="bench/results/calibrate/h200.json")
    ap.add_argument("--write-spec", action="store_true")
    args = ap.parse_args()
    raws = [json.loads((ROOT / path).read_text()) for path in args.raw]
    raw = raws[0]
    train, test, excluded = split([m for r in raws for m in r["measurements"]])
    attn_train = [r for r in train if family(r) == "attention_triton"]
    train = [r for r in train if family(r) != "attention_triton"]
    hw0 = load_hardware("h200")
    before = table(with_params(hw0, PUBLIC_STARTS), test)
    values = fit(hw0, train, PARAMS, PUBLIC_STARTS)
    hw = with_params(hw0, values)
    attention = fit(hw, attn_train, ATTENTION_PARAMS, {"attention_compute": 0.55, "attention_memory": 0.87})
    hw_attn = with_params(hw, attention)
    after = [row for row in table(hw, test) if row["family"] != "attention_triton"]
    after += [row for row in table(hw_attn, test) if row["family"] == "attention_triton"]
    fams = sorted({r["family"] for r in after})
    report = {
        "command": "python3 bench/calibrate/h200_kernels.py --out $OUT/h200_raw.json; python3 "
        "bench/calibrate/h200_kernels.py --extra --out $OUT/h200_raw2.json (device: nvidia-h200); "
        ".venv/bin/python bench/calibrate/fit.py --write-spec",
        "device": raw["device"],
        "torch": raw["torch"],
        "train_n": len(train),
        "heldout_n": len(test),
        "excluded": {
            "n": len(excluded),
            "why": "attention via torch SDPA: no fused kernel for head dim 512, "
            "it runs the math fallback (10-60x slower than the bmm path); not a kernel the model charges. "
            "grouped (torch._grouped_mm / _scaled_grouped_mm) rows: not the fastest expert kernel at these "
            "shapes; grouped_compute/grouped_memory are fitted to the fastest one by fit_expert_launch.py",
        },
        "notes": [
            "attention_bmm is predicted, never fitted: QK and PV as batched GEMMs + 4 streaming softmax kernels "
            "from the fitted GEMM/copy parameters; the fused-attention efficiency of h200 keeps its public start",
            "copy is bimodal on this H200: 3.6-4.2 TB/s (read+write) at 64-256 MB, 2.75 TB/s from 512 MB up; "
            "copies over 256 MB are excluded (one kernel of the model never streams that much: the mHC "
            "residual of a 256-sequence decode step is ~63 MB per layer)",
            "attention_triton: our own split-KV Triton kernel for 64 heads over one shared 512-dim K=V head "
            "(checked against a torch reference, max abs err <= 2.4e-3). It reaches only ~95 TFLOP/s (10% of "
            "BF16 peak) where FlashMLA-class kernels report ~65% on Hopper, so its fitted attention "
            "efficiencies (attention_triton_fit_not_in_spec) test the form of attention_time on held-out "
            "shapes but are NOT written into h200.yaml, which keeps REFERENCE's public values",
        ],
        "fitted": values,
        "attention_triton_fit_not_in_spec": attention,
        "heldout_all": summary(after),
        "heldout_fitted_families": summary(
            [r for r in after if not r["family"].startswith("attention")]
        ),
        "heldout_gemm_and_grouped": summary(
            [r for r in after if r["family"].startswith(("gemm_", "grouped_"))]
        ),
        "heldout_by_family": {f: summary([r for r in after if r["family"] == f]) for f in fams},
        "heldout_before_fit_public_starts": summary(before),
        "rows": after,
    }
    (ROOT / args.out).write_text(json.dumps(report, indent=1))
    print(f"{'family':18} {'n':>3} {'median|err|%':>13} {'worst|err|%':>12}")
    for f in fams:
        s = report["heldout_by_family"][f]
        print(f"{f:18} {s['n']:3d} {s['median_abs_pct']:13.1f} {s['worst_abs_pct']:12.1f}")
    for key in (
        "heldout_gemm_and_grouped",
        "heldout_fitted_families",
        "heldout_all",
        "heldout_before_fit_public_starts",
    ):
        s = report[key]
        print(
            f"{key:34} n={s['n']:3d} median {s['median_abs_pct']:.1f}%  worst {s['worst_abs_pct']:.1f}% ({s['worst_case']['family']})"
        )
    print("fitted:", {k: float(f"{v:.4g}") for k, v in values.items()})
    if args.write_spec:
        write_spec(values, " + ".join(args.raw))
        print(f"wrote {SPEC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
