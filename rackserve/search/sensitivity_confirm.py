"""Confirm the screened sensitivity by replay: the top parameters of each rack at -25% / +25%, on the
point its frontier chose at a target (configuration and lanes), replayed by the discrete-event simulator
with the perturbed cost model beside one replay with the files' values; the screen's move at the same
configuration and lanes stands next to it, so a reader sees whether the analytic ranking holds.

A move here is at fixed lanes (throughput per GPU and P90 E2E interactivity both move), where the screened
table's moves are along the envelope at a target; both come from the same perturbed spec.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rackserve.search.frontier import rack_mix
from rackserve.search.rack import Config, RackSpec, scenario_of
from rackserve.search.screen import TimingCache, screen_config
from rackserve.search.sensitivity import STEPS, FreeParam, PerturbedCache, X, free_parameters
from rackserve.sim.run import simulate
from rackserve.sim.sizing import prefill_chunk_tokens
from rackserve.sim.step_cache import CachedTiming

FIGURES = ("throughput_per_gpu", X)


def chosen_point(frontier: dict, target: str | None = None) -> tuple[Config, int, str]:
    """(configuration, lanes, target) of the frontier's replayed point at `target` (default: its first)."""
    at = frontier.get("at_target") or {}
    names = [t for t, v in at.items() if v and v.get("point")]
    if not names:
        raise ValueError("frontier: no replayed point at any target (at_target[...].point)")
    name = target if target is not None else names[0]
    if name not in names:
        raise ValueError(f"target: the frontier has points at {names}, not {name!r}")
    point = at[name]["point"]
    return Config.from_dict(point["config"]), int(point["concurrency"]), name


def replayed(rack: RackSpec, cfg: Config, lanes: int, cache: TimingCache) -> dict:
    scenario = scenario_of(rack, cfg, lanes)
    tm = cache.get(scenario).with_reference_chunk(prefill_chunk_tokens(scenario.sim))
    res = simulate(scenario, policy=cfg.policy, timing=CachedTiming(tm))
    return {f: getattr(res, f) for f in FIGURES} | {"cpu_s": res.cpu_s}


def screened(rack: RackSpec, cfg: Config, lanes: int, cache: TimingCache, mix) -> dict:
    """The screen's figures at `lanes`, interpolated along its curve of the configuration."""
    pts = sorted(screen_config(rack, cfg, mix, cache).points, key=lambda p: p["concurrency"])
    xs = [p["concurrency"] for p in pts]
    return {f: float(np.interp(lanes, xs, [p[f] for p in pts])) for f in FIGURES}


def _move(got: dict, base: dict) -> dict:
    return {f: (got[f] / base[f] - 1.0 if base.get(f) else None) for f in FIGURES}


def confirm(doc: dict, racks: list[RackSpec], frontiers: dict[str, dict], top: int = 3,
            target: str | None = None, progress=print) -> dict:
    """The `confirmed` section of sensitivity.json: per rack, the top `top` parameters of `doc`'s ranking
    replayed at the frontier's point (module docstring)."""
    out = {"method": __doc__.strip().splitlines()[0], "top": top, "racks": {}}
    for rack in racks:
        if rack.name not in frontiers:
            continue
        cfg, lanes, name = chosen_point(frontiers[rack.name], target)
        mix = rack_mix(rack)
        params = {p.name: p for kind, spec in (("hardware", rack.timing["hardware"]),
                                                ("model", rack.timing.get("model", "deepseek-v4.1-flash")))
                  for p in free_parameters(kind, spec)}
        chosen = [r["param"] for r in doc["rows"] if r["rack"] == rack.name][:top]
        base_r = replayed(rack, cfg, lanes, TimingCache())
        base_s = screened(rack, cfg, lanes, TimingCache(), mix)
        rows = []
        for pname in chosen:
            p: FreeParam = params[pname]
            for f in STEPS:
                progress(f"{rack.name}: {pname} x {f:g}")
                cache = PerturbedCache(p, f)
                rep = replayed(rack, cfg, lanes, cache)
                scr = screened(rack, cfg, lanes, PerturbedCache(p, f), mix)
                rows.append({"param": pname, "factor": f, "replayed": _move(rep, base_r), "screened": _move(scr, base_s),
                             "cpu_s": rep["cpu_s"]})
        out["racks"][rack.name] = {"target": name, "config": cfg.label, "concurrency": lanes,
                                   "base_replayed": base_r, "base_screened": base_s, "rows": rows,
                                   "rank_agrees": _rank_agrees(rows)}
    return out


def _rank_agrees(rows: list[dict]) -> bool | None:
    """Do the replays rank the parameters as the screen does (by the largest throughput move of each)?"""
    def order(kind: str) -> list[str]:
        worst: dict[str, float] = {}
        for r in rows:
            v = r[kind]["throughput_per_gpu"]
            if v is not None:
                worst[r["param"]] = max(worst.get(r["param"], 0.0), abs(v))
        return sorted(worst, key=lambda k: -worst[k])
    a, b = order("replayed"), order("screened")
    return a == b if a and b else None


def markdown(section: dict) -> str:
    lines = [f"Replayed at the frontier's point (top {section['top']} per rack): moves at fixed lanes, "
             "replay vs screen.", "",
             "| rack | point | parameter | x | throughput: replay / screen | P90 E2E tok/s/user: replay / screen |",
             "|---|---|---|---:|---|---|"]
    for rack, r in section["racks"].items():
        for row in r["rows"]:
            cells = [" / ".join("-" if row[k][f] is None else f"{row[k][f]:+.1%}" for k in ("replayed", "screened"))
                     for f in FIGURES]
            lines.append(f"| {rack} | {r['config']} @ {r['concurrency']} ({r['target']}) | `{row['param']}` | "
                         f"{row['factor']:g} | {cells[0]} | {cells[1]} |")
        lines.append(f"| {rack} | ranking by replay agrees with the screen: {r['rank_agrees']} | | | | |")
    return "\n".join(lines) + "\n"


def read_frontiers(paths: list[Path]) -> dict[str, dict]:
    import json

    docs = {}
    for p in paths:
        d = json.loads(Path(p).read_text())
        docs[d["rack"]] = d
    return docs
