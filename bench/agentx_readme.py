"""Write README.md's "AgentX on the rack" section from the committed sweep JSON.

    .venv/bin/python bench/agentx_readme.py bench/results/agentx-rack/sweep-*.json \
        --window bench/results/agentx-rack/window900-*.json bench/results/agentx-rack/frontier900-*.json \
        --base nvl72-gb300 --out bench/results/agentx-rack

Merges the sweep files (their runs; each run keeps the code commit and the measured window it ran
with) and the --window files (points of the scenarios' own window, AgentX's 900 s). Each curve
(scenario, policy) is drawn from its 900 s points where it has at least MIN_LONG_POINTS of them (the
measured window AgentX reports), else from its 60 s points; every table row says which. Recomputes
the frontiers, peaks, throughput at the targets and the ratios (rackserve.sim.cli_sweep.sweep_payload)
over each curve's operating points (lanes up to its peak: past the peak throughput falls and the queue
moves into TTFT, which tok/s/user does not see), writes sweep.json, sweep-frontier.png and
sweep-lanes.png (every point by lanes) into --out, and replaces the README section between its
markers with tables generated from that JSON. The 60 s points stay in their own table: they reach
1 to 20,000 lanes, the 900 s ones do not.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from rackserve.sim.cli_sweep import sweep_payload
from rackserve.sim.sweep_plot import plot_by_lanes, plot_frontiers

BEGIN, END = "<!-- agentx-rack:begin (bench/agentx_readme.py) -->", "<!-- agentx-rack:end -->"
SATURATED = 0.8  # busy share from which a path or the prefill ranks count as the bottleneck
TIERS = ("rank_hbm", "pool_hbm", "pool_dram")
MIN_LONG_POINTS = 3  # 900 s points a curve needs to be drawn from them (a frontier, not just its peak)


def bottleneck(run: dict) -> str:
    """What limits this point: a pool path or the prefill ranks once they are busy >= SATURATED of the
    time (their queue then shows in TTFT), else decode (its ranks step whenever they hold a batch, so
    their busy share is ~100% at any load: it is the batch growing that lowers tok/s/user)."""
    paths = {k: v for k, v in run.get("pool_path_util", {}).items() if v >= SATURATED}
    if paths:
        name, value = max(paths.items(), key=lambda kv: kv[1])
        return f"pool path {name} ({value:.0%} busy)"
    if run["prefill_util"] >= SATURATED:
        return f"prefill ranks ({run['prefill_util']:.0%} busy, TTFT P90 {run['ttft_p90_s']:.1f} s)"
    return f"decode batch (prefill {run['prefill_util']:.0%} busy)"


def _num(v: float | None, fmt: str = "{:,.0f}") -> str:
    return "n/a" if v is None else fmt.format(v)


def load_runs(paths: Sequence[Path]) -> tuple[list[dict], list[str]]:
    """Every file's runs (a run without its own code/window takes its file's) and one 'produced by'
    line per file; the same (scenario, policy, lanes, window) twice is an error."""
    rows, produced, seen = [], [], set()
    for path in paths:
        f = json.loads(path.read_text())
        for r in f["runs"]:
            r = {**f.get("window", {}), "code": f.get("code", "?"), **r}
            key = (r["scenario"], r["policy"], r["concurrency"], r.get("measure_start_s"), r.get("window_s"))
            if key in seen:
                raise ValueError(f"{path}: point {key} is in more than one file")
            seen.add(key)
            rows.append(r)
        win = f.get("window", {})
        lanes = ",".join(str(c) for c in sorted({r["concurrency"] for r in f["runs"]}))
        produced.append(f"`{f.get('command', '?')}` (lanes run {lanes}; code {f.get('code', '?')}, window "
                        f"[{win.get('measure_start_s', '?'):g} s, +{win.get('window_s', '?'):g} s); -> {path})")
    return rows, produced


def curve_key(r: dict) -> tuple[str, str]:
    return r["scenario"], r["policy"]


def split_at_peak(rows: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """(operating points: lanes up to the curve's peak, points past the peak)."""
    peak_lanes = {}
    for r in rows:
        best = peak_lanes.get(curve_key(r))
        if best is None or r["throughput_per_gpu"] > best[1]:
            peak_lanes[curve_key(r)] = (r["concurrency"], r["throughput_per_gpu"])
    ops = [r for r in rows if r["concurrency"] <= peak_lanes[curve_key(r)][0]]
    return ops, [r for r in rows if r["concurrency"] > peak_lanes[curve_key(r)][0]]


def choose_curves(short: Sequence[dict], long: Sequence[dict],
                  min_long: int = MIN_LONG_POINTS) -> tuple[list[dict], dict[tuple[str, str], float]]:
    """The rows each curve is drawn from: its long-window points where it has >= min_long of them,
    else its short-window ones; and each curve's window length (s)."""
    by_curve: dict[tuple[str, str], list[dict]] = {}
    for r in long:
        by_curve.setdefault(curve_key(r), []).append(r)
    use_long = {k for k, v in by_curve.items() if len(v) >= min_long}
    rows = [r for r in short if curve_key(r) not in use_long] + [r for r in long if curve_key(r) in use_long]
    windows = {curve_key(r): r["window_s"] for r in rows}
    return rows, windows


def label_windows(payload: dict, windows: dict[tuple[str, str], float], extended: set) -> None:
    """Put each curve's window (and whether its peak is its highest lanes run) on it, and both
    sides' windows on each ratio."""
    for c in payload["curves"]:
        c["window_s"] = windows[curve_key(c)]
        c["peak_at_last_lane_run"] = curve_key(c) not in extended
    for r in payload["ratios"]:
        r["base_window_s"] = windows[(r["base"], r["policy"])]
        r["other_window_s"] = windows[(r["other"], r["policy"])]


def _window_cell(c: dict) -> str:
    return f"{c['window_s']:g} s" + (" (peak = its highest lanes run: a lower bound)" if c.get("peak_at_last_lane_run") else "")


def main_table(payload: dict, runs: dict) -> list[str]:
    targets = payload["target_tps_user"]
    lines = ["| scenario | policy | window | peak tok/s/GPU (lanes, tok/s/user) | "
             + " | ".join(f"tok/s/GPU at {t:g} tok/s/user" for t in targets)
             + " | hit rank / pool HBM / pool DRAM | TTFT P50 / P90 (s) | rank idle prefill / decode | "
               "bottleneck at peak |",
             "|" + "---|" * (8 + len(targets))]
    for c in payload["curves"]:
        pk = c["peak"]
        run = runs[(c["scenario"], c["policy"], pk["concurrency"], c["window_s"])]
        h = run["hit_rate_by_tier"]
        at = " | ".join(_num(c["at_target"][f"{t:g}"]["p50"]) for t in targets)
        lines.append(
            f"| {c['scenario']} | {c['policy']} | {_window_cell(c)} | "
            f"{pk['throughput_per_gpu']:,.0f} ({pk['concurrency']:,}, "
            f"{pk['user_tps_p50']:.0f}) | {at} | {h['rank_hbm']:.1%} / {h['pool_hbm']:.1%} / {h['pool_dram']:.1%} | "
            f"{run['ttft_p50_s']:.2f} / {run['ttft_p90_s']:.2f} | {run['prefill_idle_frac']:.1%} / "
            f"{run['decode_idle_frac']:.1%} | {bottleneck(run)} |")
    return lines


def first_saturated(pts: Sequence[dict]) -> str:
    """The lowest lane count whose prefill ranks are >= SATURATED busy (pool paths checked first)."""
    for r in pts:
        if bottleneck(r).startswith(("pool", "prefill")):
            return f"{r['concurrency']:,}: {bottleneck(r)}"
    return "none (decode batch)"


def peak_table(rows: Sequence[dict]) -> list[str]:
    """Per curve: lanes run, the peak, each point past it, the lowest tok/s/user reached, what
    saturates first, the busiest pool path and the fullest pool tier over the whole curve."""
    lines = ["| scenario | policy | lanes run | peak (lanes: tok/s/GPU) | past the peak (lanes: tok/s/GPU, x peak, "
             "TTFT P50 / P90 s) | lowest tok/s/user P50 | first to saturate (lanes) | busiest pool path | "
             "fullest pool tier (lanes) |", "|" + "---|" * 9]
    for key in sorted({curve_key(r) for r in rows}):
        pts = sorted((r for r in rows if curve_key(r) == key), key=lambda r: r["concurrency"])
        pk = max(pts, key=lambda r: r["throughput_per_gpu"])
        past = "; ".join(f"{r['concurrency']:,}: {r['throughput_per_gpu']:,.0f}, "
                         f"x{r['throughput_per_gpu'] / pk['throughput_per_gpu']:.2f}, "
                         f"{r['ttft_p50_s']:.1f} / {r['ttft_p90_s']:.1f}"
                         for r in pts if r["concurrency"] > pk["concurrency"]) or "not run"
        path = max(((k, v, r["concurrency"]) for r in pts for k, v in r["pool_path_util"].items()),
                   key=lambda t: t[1])
        occ = max(((k, v, r["concurrency"]) for r in pts for k, v in r["pool_occupancy"].items()),
                  key=lambda t: t[1])
        lanes = "-".join(f"{r['concurrency']:,}" for r in pts)
        lines.append(
            f"| {key[0]} | {key[1]} | {lanes} | "
            f"{pk['concurrency']:,}: {pk['throughput_per_gpu']:,.0f} | {past} | "
            f"{min(r['user_tps_p50'] for r in pts):.0f} | {first_saturated(pts)} | "
            f"{path[0]} {path[1]:.2%} ({path[2]:,}) | {occ[0]} {occ[1]:.0%} ({occ[2]:,}) |")
    return lines


def tokens_per_request(run: dict) -> float:
    """Mean (input + output) tokens of a measured request."""
    return run["throughput_per_gpu"] * run["gpus"] * run["span_s"] / max(run["completed"], 1)


def _hits(w: dict) -> str:
    return " / ".join(f"{w['hit_rate_by_tier'][t]:.1%}" for t in TIERS)


def _ttft(w: dict) -> str:
    return f"{w['ttft_p50_s']:.2f} / {w['ttft_p90_s']:.2f}"


WINDOW_CELLS = (  # (column, value of one run) of the 60 s -> 900 s table
    ("tok/s/user P50", lambda w: f"{w['user_tps_p50']:.0f}"),
    ("TTFT P50 / P90 (s)", _ttft),
    ("hit rank / pool HBM / pool DRAM", _hits),
    ("pool HBM full", lambda w: f"{w['pool_occupancy']['pool_hbm']:.0%}"),
    ("prefill busy", lambda w: f"{w['prefill_util']:.0%}"),
    ("k tokens per request", lambda w: f"{tokens_per_request(w) / 1e3:.1f}"),
)


def window_table(short: Sequence[dict], long: Sequence[dict]) -> list[str]:
    """Each long-window point beside the same point of the sweep (same scenario, policy, lanes): one
    row, '60 s -> 900 s' in each cell."""
    index = {(r["scenario"], r["policy"], r["concurrency"]): r for r in short}
    lines = ["| scenario | policy | lanes | tok/s/GPU (900/60) | " + " | ".join(c for c, _ in WINDOW_CELLS)
             + " | code (900 s) | CPU s (900 s) |", "|" + "---|" * (6 + len(WINDOW_CELLS))]
    for r in sorted(long, key=lambda r: (r["scenario"], r["policy"], r["concurrency"])):
        s = index.get((r["scenario"], r["policy"], r["concurrency"]))
        if s is None:
            continue
        cells = " | ".join(f"{f(s)} -> {f(r)}" for _, f in WINDOW_CELLS)
        lines.append(
            f"| {r['scenario']} | {r['policy']} | {r['concurrency']:,} | {s['throughput_per_gpu']:,.0f} -> "
            f"{r['throughput_per_gpu']:,.0f} ({r['throughput_per_gpu'] / s['throughput_per_gpu']:.3f}) | {cells} | "
            f"{r['code']} | {r.get('point_cpu_s', r['cpu_s']):,.0f} |")
    return lines


def _win(seconds: float) -> str:
    return f"{seconds:g} s"


def ratio_lines(ratios: Sequence[dict]) -> list[str]:
    out = []
    for r in ratios:
        wins = f"{_win(r['other_window_s'])} / {_win(r['base_window_s'])}"
        mixed = "" if r["other_window_s"] == r["base_window_s"] else " (mixed windows)"
        out.append(f"- {r['policy']} at {r['target_tps_user']:g} tok/s/user: {r['other']} / {r['base']} = "
                   f"{_num(r['ratio'], '{:.2f}x')} ({wins}{mixed})")
    return out


def section(payload: dict, produced: Sequence[str], notes: Sequence[str] = ()) -> str:
    short, long = payload["runs"], payload["window_runs"]
    runs = {(r["scenario"], r["policy"], r["concurrency"], r["window_s"]): r for r in [*short, *long]}
    lines = [BEGIN, "## AgentX on the rack", "",
             "Generated by `bench/agentx_readme.py` from `bench/results/agentx-rack/sweep.json` (do not edit by hand).",
             "Workload: the real AgentX capture (`data/agentx`, 350 conversations) replayed by the AgentX rules; "
             "capacities derived from the specs (`rackserve/timing/capacity.py`). Throughput per GPU = "
             "(input + output tokens)/s / GPUs; interactivity = output tok/s per user (P50, decode only: "
             "1000 / TPOT ms, TTFT not included). Each curve is drawn from the measured window AgentX uses, "
             "900 s ([60 s, 960 s) after the warm-ups, the scenarios' own), where it has at least "
             f"{MIN_LONG_POINTS} points run there, else from 60 s windows ([30 s, 90 s)); the `window` column "
             "says which. Frontiers, peaks, the target columns and the ratios use each curve's operating points "
             "(lanes up to its peak). `sweep.json` is `rackserve sim sweep`'s schema plus `past_peak` (runs past "
             "each curve's peak), `window_runs` (the 900 s points; `runs` holds the 60 s ones) and each curve's "
             "`window_s`; every run row carries `code`, `measure_start_s` and `window_s`.",
             "", *main_table(payload, runs), "",
             "The 900 s points (AgentX's window), where each curve peaks and what saturates first:", "",
             *peak_table(long),
             "", "The 60 s points, 1 to 20,000 lanes (the reach: past the peaks, to 20,000 lanes):", "",
             *peak_table(short)]
    if long:
        lines += ["", "60 s vs 900 s window at the same point (each cell: 60 s -> 900 s):", "",
                  *window_table(short, long)]
    lines += ["", "Frontier points (operating points; lanes: tok/s/user P50 -> tok/s/GPU):", ""]
    for c in payload["curves"]:
        pts = ", ".join(f"{p['concurrency']:,}: {p['user_tps_p50']:.0f} -> {p['throughput_per_gpu']:,.0f}"
                        for p in c["frontier_p50"])
        lines.append(f"- {c['scenario']} {c['policy']} ({_win(c['window_s'])}): {pts}")
    if payload["ratios"]:
        lines += ["", "Ratios at the targets (P50 frontier; n/a where a frontier does not reach the target; "
                  "windows other / base):", "", *ratio_lines(payload["ratios"])]
    if notes:
        lines += ["", "Caveats:", ""] + [f"- {n}" for n in notes]
    lines += ["", "![frontiers](bench/results/agentx-rack/sweep-frontier.png)", "",
              "Every point by lanes (the frontiers above leave out the points past each peak; "
              "lines: 60 s windows, hollow: 900 s):", "",
              "![by lanes](bench/results/agentx-rack/sweep-lanes.png)", "",
              "Produced by: " + "; ".join(produced), END]
    return "\n".join(lines)


def read_notes(path: Path | None) -> list[str]:
    """The caveat lines of a notes file: one per line, blank and '#' lines skipped."""
    if path is None:
        return []
    lines = (ln.strip() for ln in path.read_text().splitlines())
    return [ln.removeprefix("- ") for ln in lines if ln and not ln.startswith("#")]


def write_readme(readme: Path, text: str) -> None:
    old = readme.read_text()
    if BEGIN in old and END in old:
        new = old[: old.index(BEGIN)] + text + old[old.index(END) + len(END):]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    readme.write_text(new)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweeps", nargs="+", type=Path, help="sweep files of bench/agentx_sweep.py / `rackserve sim sweep`")
    ap.add_argument("--window", nargs="*", type=Path, default=[], help="the same points with another window")
    ap.add_argument("--out", type=Path, default=Path("bench/results/agentx-rack"))
    ap.add_argument("--readme", type=Path, default=Path("README.md"))
    ap.add_argument("--command", action="append", default=[], help="a command to list under 'Produced by'")
    ap.add_argument("--target-tps-user", default="", help="comma-separated targets (default: the sweeps')")
    ap.add_argument("--note", action="append", default=[], help="a caveat line for the section")
    ap.add_argument("--notes-file", type=Path, default=None,
                    help="caveat lines, one per line (blank lines and '#' lines skipped), after the --note ones")
    ap.add_argument("--base", default=None, help="scenario the ratios are relative to (default: the first)")
    args = ap.parse_args()
    short, produced = load_runs(args.sweeps)
    long, long_produced = load_runs(args.window) if args.window else ([], [])
    targets = ([float(t) for t in args.target_tps_user.split(",") if t]
               or json.loads(args.sweeps[0].read_text())["target_tps_user"])
    curve_rows, windows = choose_curves(short, long)
    ops, past = split_at_peak(curve_rows)
    payload = sweep_payload(ops, targets, args.base)
    label_windows(payload, windows, {curve_key(r) for r in past})
    payload.update(runs=short, past_peak=past, window_runs=long,
                   produced_by=[*args.command, *produced, *long_produced])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sweep.json").write_text(json.dumps(payload, indent=1, default=float) + "\n")
    drawn = {curve_key(r) for r in long if windows[curve_key(r)] == r["window_s"]}
    plot_frontiers(payload["curves"], args.out / "sweep-frontier.png", payload["target_tps_user"],
                   [r for r in long if curve_key(r) not in drawn], "hollow: 900 s points of the 60 s curves")
    plot_by_lanes(short, args.out / "sweep-lanes.png", long, "hollow: 900 s window")
    notes = [*args.note, *read_notes(args.notes_file)]
    text = section(payload, [f"`{c}`" for c in args.command] + produced + long_produced, notes)
    write_readme(args.readme, text)
    print(text)


if __name__ == "__main__":
    main()
