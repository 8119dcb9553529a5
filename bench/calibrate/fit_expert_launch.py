"""Fit the H200 expert-GEMM efficiencies to the fastest measured kernel, and the launch gaps to the
kernel chains; report held-out errors per kind.

    .venv/bin/python bench/calibrate/fit_expert_launch.py [--write-spec]

Input: bench/results/calibrate/expert_raw.json and launch_raw.json (written on the H200 by
bench/calibrate/h200_expert_launch.py). Output: bench/results/calibrate/expert_launch.json.

Expert GEMMs: for every (GEMM, experts, tokens per expert) the fastest of torch.bmm,
torch._grouped_mm and our Triton grouped GEMM is what a tuned deployment runs, so grouped_compute
and grouped_memory of rackserve/timing/roofline.grouped_gemm_time are fitted to those minima
(kernel_overhead_s stays as fit.py fitted it on the dense GEMMs). Within each (GEMM, experts) sweep
over tokens per expert, alternate sizes train and the others are held out. Launch: per-kernel time
of a chain = gap + streamed bytes / bandwidth, fitted per mode (graph replay, graph + PDL) on
alternate prologue sizes and checked on the others; the zero-byte chains give the gaps directly.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

import numpy as np

from rackserve.timing.roofline import grouped_gemm_time
from rackserve.timing.spec import HardwareSpec, load_hardware

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "rackserve/timing/specs/hardware/h200.yaml"
EXPERT_RAW = "bench/results/calibrate/expert_raw.json"
LAUNCH_RAW = "bench/results/calibrate/launch_raw.json"
OUT = "bench/results/calibrate/expert_launch.json"
IMPLS = ("torch.bmm", "torch._grouped_mm", "triton")
# grouped_compute, grouped_memory as bench/calibrate/fit.py had fitted them to torch._grouped_mm
# (bench/results/calibrate/h200.json before this calibration): how far that fit is from the fastest kernel
GROUPED_MM_FIT = (0.6173, 0.596)
FULL_WAVE = 132  # the chain kernel with one CTA per SM: the gap the spec keeps


def fastest(rows: list[dict]) -> list[dict]:
    """One row per (GEMM, experts, tokens per expert): the fastest implementation, and every time."""
    by: dict[tuple, dict] = {}
    for r in rows:
        if r.get("kind") != "expert" or "time_s" not in r:
            continue
        key = (r["name"], r["experts"], r["tokens_per_expert"])
        entry = by.setdefault(
            key,
            {**{k: r[k] for k in ("name", "experts", "tokens_per_expert", "k", "n")}, "times": {}},
        )
        entry["times"][r["impl"]] = r["time_s"]
    out = []
    for entry in by.values():
        impl = min(entry["times"], key=entry["times"].get)
        out.append({**entry, "impl": impl, "time_s": entry["times"][impl]})
    return sorted(out, key=lambda r: (r["name"], r["experts"], r["tokens_per_expert"]))


def predict(hw: HardwareSpec, rows: list[dict]) -> np.ndarray:
    e, t, n, k = (
        np.array([r[x] for r in rows], float) for x in ("experts", "tokens_per_expert", "n", "k")
    )
    return grouped_gemm_time(
        hw, e * t, e * k * n * 2.0, n, k, math_dtype="bf16", act_bytes_per_row=k * 2.0 + n * 2.0
    )[0]


def with_grouped(hw: HardwareSpec, compute: float, memory: float) -> HardwareSpec:
    eff = hw.efficiency.model_copy(update={"grouped_compute": compute, "grouped_memory": memory})
    return hw.model_copy(update={"efficiency": eff})


def split(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    train, test = [], []
    sweeps: dict[tuple, list[dict]] = {}
    for r in rows:
        sweeps.setdefault((r["name"], r["experts"]), []).append(r)
    for i, (_, sweep) in enumerate(sorted(sweeps.items())):
        sweep.sort(key=lambda r: r["tokens_per_expert"])
        first = i % 2  # alternate which end trains, so both ends get judged
        train += sweep[first::2]
        test += sweep[1 - first :: 2]
    return train, test


def fit_grouped(hw0: HardwareSpec, train: list[dict]) -> tuple[float, float]:
    """Grid search (coarse, then fine) of the mean squared log error; memory capped at 0.95."""
    measured = np.array([r["time_s"] for r in train])

    def loss(c: float, m: float) -> float:
        return float(np.mean(np.log(predict(with_grouped(hw0, c, m), train) / measured) ** 2))

    best = (0.6, 0.6)
    for step, span in ((0.02, None), (0.002, 0.03)):
        cs = (
            np.arange(0.2, 1.0 + 1e-9, step)
            if span is None
            else np.arange(best[0] - span, best[0] + span, step)
        )
        ms = (
            np.arange(0.2, 0.95 + 1e-9, step)
            if span is None
            else np.arange(best[1] - span, min(best[1] + span, 0.95) + 1e-9, step)
        )
        grid = [(loss(c, m), c, m) for c in cs if 0 < c <= 1 for m in ms if 0 < m <= 0.95]
        _, c, m = min(grid)
        best = (float(c), float(m))
    return best


def errors(hw: HardwareSpec, rows: list[dict]) -> list[dict]:
    pred = predict(hw, rows)
    return [
        {
            **{k: r[k] for k in ("name", "experts", "tokens_per_expert", "impl")},
            "measured_s": r["time_s"],
            "predicted_s": float(p),
            "error_pct": (float(p) - r["time_s"]) / r["time_s"] * 100,
        }
        for r, p in zip(rows, pred, strict=True)
    ]


def summary(rows: list[dict]) -> dict:
    errs = np.abs([r["error_pct"] for r in rows])
    return {
        "n": len(rows),
        "median_abs_pct": float(np.median(errs)),
        "max_abs_pct": float(errs.max()),
    }


def launch_fit(rows: list[dict]) -> dict:
    """Per mode: the zero-byte gaps, and gap + bytes / bandwidth fitted on alternate prologue sizes."""
    rows = [r for r in rows if r.get("kind") == "launch"]
    out = {}
    for pdl in (False, True):
        mode = "graph_pdl" if pdl else "graph"
        chain = sorted((r for r in rows if r.get("impl") == "triton" and r["graph"] and r["pdl"] == pdl and r["grid"] == 132),
                       key=lambda r: r["prologue_bytes"])  # fmt: skip
        train, test = chain[0::2], chain[1::2]
        x = np.array([r["prologue_bytes"] for r in train], float)
        y = np.array([r["time_per_kernel_s"] for r in train])
        slope, gap = np.polyfit(x, y, 1)
        held = [{"prologue_bytes": r["prologue_bytes"], "measured_s": r["time_per_kernel_s"],
                 "predicted_s": float(gap + slope * r["prologue_bytes"]),
                 "error_pct": float((gap + slope * r["prologue_bytes"] - r["time_per_kernel_s"]) / r["time_per_kernel_s"] * 100)}
                for r in test]  # fmt: skip
        zero = {r["grid"]: r["time_per_kernel_s"] for r in rows
                if r.get("impl") == "triton" and r["graph"] and r["pdl"] == pdl and r["prologue_bytes"] == 0}  # fmt: skip
        out[mode] = {"fit_gap_s": float(gap), "fit_bytes_per_s": float(1 / slope), "zero_byte_gap_s_by_grid": zero,
                     "heldout": held, "heldout_summary": summary(held)}  # fmt: skip
    # what PDL hid beyond the smaller gap, per prologue size: (graph - PDL) - (gap graph - gap PDL)
    by = {(r["pdl"], r["prologue_bytes"]): r["time_per_kernel_s"] for r in rows
          if r.get("impl") == "triton" and r["graph"] and r["grid"] == FULL_WAVE}  # fmt: skip
    gap_cut = by[(False, 0)] - by[(True, 0)]
    out["pdl_hidden_beyond_gap_s"] = {b: by[(False, b)] - by[(True, b)] - gap_cut
                                      for (pdl, b) in sorted(by) if not pdl and b > 0}  # fmt: skip
    eager = [r["time_per_kernel_s"] for r in rows if not r["graph"]]
    torch_graph = [
        r["time_per_kernel_s"] for r in rows if r.get("impl") == "torch.add_" and r["graph"]
    ]
    out["eager_launch_s"] = {"median": statistics.median(eager), "all": eager}
    out["torch_graph_gap_s"] = torch_graph
    out["chains_ordered"] = all(
        r["chain_check"]["got_min"] == r["chain_check"]["expected"]
        for r in rows
        if "chain_check" in r
    )
    return out


def write_spec(compute: float, memory: float, graph_gap: float, pdl_gap: float) -> None:
    text = SPEC.read_text()
    note = f"CALIBRATED to the fastest expert kernel: bench/calibrate/fit_expert_launch.py on {EXPERT_RAW} (see {OUT})"
    for leaf, value in (("grouped_compute", compute), ("grouped_memory", memory)):
        text, n = re.subn(
            rf"^(\s*{leaf}: )[^#\n]*#.*$", rf"\g<1>{value:.4g}  # {note}", text, count=1, flags=re.M
        )
        assert n == 1, leaf
    lnote = f"CALIBRATED: bench/calibrate/fit_expert_launch.py on {LAUNCH_RAW}"
    for leaf, value, what in (("graph_gap_s", graph_gap, "graph-replayed 132-CTA kernels"),
                              ("pdl_gap_s", pdl_gap, "the same with PDL")):  # fmt: skip
        text, n = re.subn(
            rf"^(\s*{leaf}: )[^#\n]*#.*$",
            rf"\g<1>{value:.3g}  # {lnote}: {what}",
            text,
            count=1,
            flags=re.M,
        )
        assert n == 1, leaf
    SPEC.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write-spec", action="store_true")
    args = ap.parse_args()
    expert = json.loads((ROOT / EXPERT_RAW).read_text())
    launch = json.loads((ROOT / LAUNCH_RAW).read_text())
    rows = fastest(expert["measurements"])
    train, test = split(rows)
    hw0 = load_hardware("h200")
    before = errors(with_grouped(hw0, *GROUPED_MM_FIT), rows)
    compute, memory = fit_grouped(hw0, train)
    hw = with_grouped(hw0, compute, memory)
    held = errors(hw, test)
    wins = {impl: sum(r["impl"] == impl for r in rows) for impl in IMPLS}
    where = {f"{r['name']} E={r['experts']} T={r['tokens_per_expert']}": r["impl"] for r in rows}
    bmm_vs = [
        r["times"]["torch._grouped_mm"] / r["times"]["torch.bmm"]
        for r in rows
        if len(r["times"]) == 3
    ]
    lf = launch_fit(launch["measurements"])
    hbm = hw0.hbm_bw_bytes_per_s
    fractions = [r["experts"] * r["k"] * r["n"] * 2.0 / r["time_s"] / hbm for r in rows]
    best = rows[int(np.argmax(fractions))]
    report = {
        "command": "python3 bench/calibrate/h200_expert_launch.py --out $OUT (device: nvidia-h200); "
        ".venv/bin/python bench/calibrate/fit_expert_launch.py --write-spec",
        "device": expert["device"], "torch": expert["torch"], "triton": expert.get("triton"),
        "expert": {
            "fitted_to": "the fastest implementation per shape",
            "fitted": {"grouped_compute": compute, "grouped_memory": memory},
            "train_n": len(train),
            "heldout_by_kind": {k: summary([r for r in held if r["name"] == k]) for k in ("expert_up", "expert_down")},
            "heldout_all": summary(held),
            "spec_before_fit_vs_fastest": {**summary(before), "mean_signed_pct": float(np.mean([r["error_pct"] for r in before]))},
            "wins": wins,
            "winner_by_shape": where,
            "grouped_mm_over_bmm_median": statistics.median(bmm_vs),
            "best_weight_stream_hbm_fraction": {"fraction": max(fractions), "shape": {k: best[k] for k in ("name", "experts", "tokens_per_expert", "impl")}},
            "heldout_rows": held,
        },
        "launch": lf,
    }  # fmt: skip
    (ROOT / OUT).write_text(json.dumps(report, indent=1))
    print(
        f"expert: fitted grouped_compute {compute:.3f} grouped_memory {memory:.3f} on {len(train)} rows"
    )
    for kind, s in report["expert"]["heldout_by_kind"].items():
        print(
            f"  held-out {kind:12} n={s['n']:2d} median |err| {s['median_abs_pct']:.1f}%  max {s['max_abs_pct']:.1f}%"
        )
    b = report["expert"]["spec_before_fit_vs_fastest"]
    print(
        f"  spec before (grouped_mm fit) vs fastest: mean {b['mean_signed_pct']:+.1f}%, median |err| {b['median_abs_pct']:.1f}%"
    )
    print(
        f"  best weight streaming: {max(fractions):.3f} of datasheet HBM ({best['name']} E={best['experts']} T={best['tokens_per_expert']} {best['impl']})"
    )
    print(
        f"  wins {wins}; torch._grouped_mm / torch.bmm median {report['expert']['grouped_mm_over_bmm_median']:.2f}"
    )
    for mode in ("graph", "graph_pdl"):
        m = lf[mode]
        print(f"launch {mode:9}: zero-byte gap {m['zero_byte_gap_s_by_grid']}, fit gap {m['fit_gap_s'] * 1e6:.2f} us, "
              f"held-out median |err| {m['heldout_summary']['median_abs_pct']:.1f}% max {m['heldout_summary']['max_abs_pct']:.1f}%")  # fmt: skip
    hidden = {k: round(v * 1e6, 2) for k, v in lf["pdl_hidden_beyond_gap_s"].items()}
    print(f"launch PDL hid beyond the gap (us, by prologue bytes): {hidden}")
    print(
        f"launch eager median {lf['eager_launch_s']['median'] * 1e6:.1f} us; chains ordered: {lf['chains_ordered']}"
    )
    if args.write_spec:
        gaps = [lf[mode]["zero_byte_gap_s_by_grid"][FULL_WAVE] for mode in ("graph", "graph_pdl")]
        write_spec(compute, memory, *gaps)
        print(f"wrote {SPEC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
