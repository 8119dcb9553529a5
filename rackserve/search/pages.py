"""Pages generated from frontier.json files: the README's short results block (between its
`<!-- frontier:begin -->` / `<!-- frontier:end -->` markers) and docs/results.md, so no figure is
typed by hand. Pure functions from report dicts to Markdown."""

from __future__ import annotations

import os
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path

BEGIN, END = "<!-- frontier:begin -->", "<!-- frontier:end -->"
WRAP = 110  # prose width (the README keeps prose lines under 120 characters)


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.0f}"


def _at(rep: dict, target: str) -> str:
    win = rep["at_target"].get(target)
    if win is None:
        return "not reached"
    mark = "" if win["source"] == "replay" else " (screen)"
    return f"{_num(win['throughput_per_gpu'])}{mark}"


def _winner(rep: dict, target: str) -> str:
    win = rep["at_target"].get(target)
    return "-" if win is None else f"`{win['config']['label']}`"


def describe(config: dict) -> str:
    """A configuration in words."""
    pre = config["prefill_count"] * config["prefill_ranks"]
    dec = config["decode_count"] * config["decode_ranks"]
    decode = (f"{config['decode_count']} TP8" if config["decode_layout"] == "tp8"
              else f"{config['decode_count']} Wide-EP {config['decode_ranks']}")
    return (f"{config['prefill_count']} DEP{config['prefill_ranks']} prefill ({pre} GPUs) + {decode} decode "
            f"({dec} GPUs), decode batch cap {config['decode_max_num_seqs']}, "
            f"{config['max_num_batched_tokens'] // 1024}k-token prefill chunks, MTP {'on' if config['mtp'] else 'off'}")


def ratio(a: dict, b: dict, target: str) -> float | None:
    wa, wb = a["at_target"].get(target), b["at_target"].get(target)
    if not wa or not wb or not wb["throughput_per_gpu"]:
        return None
    return wa["throughput_per_gpu"] / wb["throughput_per_gpu"]


def headline(reports: Sequence[dict], details: str | None = "docs/results.md") -> str:
    """The README block: one row per rack, the ratio of the first to the second, a paragraph."""
    targets = [f"{t:g}" for t in reports[0]["targets"]]
    pc = reports[0]["percentile"].upper()
    kind = "E2E-normalized" if reports[0]["interactivity"] == "e2e" else "ITL-based"
    intro = (f"Throughput per GPU (tok/s, input + output) on the envelope over every deployment searched, "
             f"read at {pc} {kind} interactivity as AgentX reads it; recorded AgentX conversations, "
             f"900 s windows unless a point says otherwise.")
    lines = [textwrap.fill(intro, WRAP), "",
             "| rack | " + " | ".join(f"at {t} tok/s/user" for t in targets) + " | peak | searched |",
             "|---|" + "---:|" * len(targets) + "---:|---|"]
    for r in reports:
        replayed = sum(p["source"] == "replay" for p in r["points"])
        lines.append(f"| {r['rack']} | " + " | ".join(_at(r, t) for t in targets) +
                     f" | {_num(r['peak']['throughput_per_gpu'] if r['peak'] else None)} | "
                     f"{r['configs_screened']} screened, {replayed} replayed |")
    if len(reports) >= 2:
        a, b = reports[0], reports[1]
        cells = []
        for t in targets:
            x = ratio(a, b, t)
            cells.append(f"{x:.2f}x" if x else "n/a")
        lines.append(f"| {a['rack']} / {b['rack']} | " + " | ".join(cells) + " | | |")
    lines += ["", findings(reports)]
    if details:  # the README links the results page; the page itself does not link itself
        lines += ["", f"Details, every point and the screen's error: [{details}]({details})."]
    return "\n".join(lines)


def findings(reports: Sequence[dict]) -> str:
    """What the search found, in words, from the reports: the winner per target and why the other
    decode layout does not win there (its best replayed point), the peak and what it costs in speed."""
    out = []
    for r in reports:
        pc = r["percentile"]
        key = f"tps_user_{pc}"
        parts = []
        for t, win in r["at_target"].items():
            if win is None:
                best = _best_replay(r, None, pc)
                parts.append(f"nothing reaches {t} tok/s/user" + (
                    f" (the fastest replayed point: {best[key]:,.0f}, `{best['config']['label']}` at "
                    f"{best['concurrency']:,} lanes, TTFT P90 {best['ttft_p90_s']:.2f} s)" if best else ""))
                continue
            where = f", near {win['point']['concurrency']:,} lanes" if win.get("point") else ""
            text = f"at {t} tok/s/user {describe(win['config'])} wins ({win['source']}{where})"
            other = "wide-ep" if win["config"]["decode_layout"] == "tp8" else "tp8"
            best = _best_replay(r, other, pc)
            if best is not None and best[key] < float(t):
                text += (f"; no {_layout_name(other)} point reaches it (best {best[key]:,.0f} tok/s/user, "
                         f"`{best['config']['label']}` at {best['concurrency']:,} lanes, TTFT P90 "
                         f"{best['ttft_p90_s']:.2f} s)")
            parts.append(text)
        if r["peak"]:
            p = r["peak"]
            parts.append(f"the peak is {describe(p['config'])} at {p['concurrency']:,} lanes, where P90 "
                         f"interactivity is {p['tps_user_p90']:,.0f} tok/s/user and TTFT P90 {p['ttft_p90_s']:.1f} s")
        out.append(f"**{r['rack']}**: " + "; ".join(parts) + ".")
    return "\n\n".join(textwrap.fill(o, WRAP) for o in out)


def _layout_name(layout: str) -> str:
    return "TP8" if layout == "tp8" else "Wide-EP"


def _best_replay(rep: dict, layout: str | None, pc: str) -> dict | None:
    """The replayed point of `layout` (any when None) with the best interactivity at `pc`."""
    pts = [p for p in rep["points"] if p.get("source") == "replay" and p.get(f"tps_user_{pc}") is not None
           and (layout is None or p["config"]["decode_layout"] == layout)]
    return max(pts, key=lambda p: p[f"tps_user_{pc}"], default=None)


def _envelope_table(rep: dict) -> list[str]:
    pc = rep["percentile"]
    rows = ["| configuration | GPUs | lanes | window s | tok/s/GPU | tok/s/user P50 | tok/s/user P90 | TTFT P90 s |"
            " source |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for p in sorted(rep["envelope"][pc], key=lambda p: -p["throughput_per_gpu"]):
        rows.append(f"| `{p['config']['label']}` | {p['config']['gpus']} | {p['concurrency']:,} | "
                    f"{_num(p.get('window_s'))} | {_num(p['throughput_per_gpu'])} | {_num(p['tps_user_p50'])} | "
                    f"{_num(p['tps_user_p90'])} | {p['ttft_p90_s']:.2f} | {p['source']} |")
    return rows


def _error_table(rep: dict) -> list[str]:
    err = rep["screen_error"]
    key = next((k for k in err if k.startswith("median_tps_user_")), "median_tps_user")
    med_t, med_s = err["median_throughput"], err.get(key)
    rows = [f"Median |screen - replay| / replay: throughput {_pct(med_t)}, interactivity {_pct(med_s)} "
            f"over {len(err['per_point'])} replayed points.", "",
            "| configuration | lanes | tok/s/GPU screen | replay | error | tok/s/user screen | replay | error |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    speed = next((k for k in (err["per_point"][0] if err["per_point"] else {}) if k.startswith("tps_user")), None)
    for row in err["per_point"]:
        t, s = row["throughput_per_gpu"], row[speed]
        rows.append(f"| `{row['config']}` | {row['concurrency']:,} | {_num(t['screen'])} | {_num(t['replay'])} | "
                    f"{_pct(t['rel_err'])} | {_num(s['screen'])} | {_num(s['replay'])} | {_pct(s['rel_err'])} |")
    return rows


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:+.1%}" if v < 0 else f"{v:.1%}"


def results_page(reports: Sequence[dict], paths: Sequence[str], page_dir: str) -> str:
    lines = ["# Results: the racks' frontiers", "",
             "Generated by `rackserve sim frontier-docs` from the frontier.json files below; do not edit by hand.",
             "Each file records the command that made it, the code it ran on and its CPU time.", "",
             headline(reports, details=None), ""]
    for rep, path in zip(reports, paths, strict=True):
        rel = os.path.relpath(path, page_dir)
        png = os.path.relpath(str(Path(path).with_name("frontier.png")), page_dir)
        win = {t: w for t, w in rep["at_target"].items()}
        lines += [f"## {rep['rack']} ({rep['hardware']}, {rep['gpus']} GPUs)", "",
                  f"[frontier.json]({rel}) · command: `{rep.get('command', '')}` · code `{rep.get('code', '')}` · "
                  f"CPU {rep['cpu_s']['total']:,.0f} s (screen {rep['cpu_s']['screen']:,.0f} s)"
                  + (f" · wall {rep['wall_s'] / 60:,.1f} min" if "wall_s" in rep and not rep.get("resumed_replays")
                     else ""), "",
                  f"![{rep['rack']} frontier]({png})", "",
                  f"{rep['configs_screened']} configurations screened ({len(rep['configs_rejected'])} did not fit), "
                  f"{sum(p['source'] == 'replay' for p in rep['points'])} points replayed.", ""]
        for t, w in win.items():
            lines.append(f"- at {t} tok/s/user: " + ("not reached" if w is None else
                         f"{_num(w['throughput_per_gpu'])} tok/s/GPU ({w['source']}), {describe(w['config'])}"))
        if rep["peak"]:
            lines.append(f"- peak: {_num(rep['peak']['throughput_per_gpu'])} tok/s/GPU at "
                         f"{rep['peak']['concurrency']:,} lanes ({rep['peak']['source']}), {describe(rep['peak']['config'])}")
        lines += [f"- envelope area between {rep['area_range'][0]:g} and {rep['area_range'][1]:g} tok/s/user: "
                  f"{rep['area']:,.3g}", "", "### Envelope", ""] + _envelope_table(rep) + \
                 ["", "### The screen against the replays", ""] + _error_table(rep) + [""]
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    """`text` with the part between the frontier markers replaced by `block`; ValueError without them."""
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"README: no {BEGIN} ... {END} block to fill")
    return pattern.sub(lambda _: f"{BEGIN}\n{block}\n{END}", text)
