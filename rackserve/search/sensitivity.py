"""Which unmeasured numbers a rack's answer hangs on: every FREE parameter of its hardware and model
files, its value and comment, and how far each headline figure (throughput per GPU on the screened
envelope at each target, the peak) moves when the parameter moves by -25% / +25%, ranked.

Screened analytically (search/screen.py) over the configurations on the rack's screened envelope, each
perturbed spec priced by the same cost model; sizing (memory) keeps the files' values. With a second
rack (`versus`), the rack-over-rack ratio of each figure too. The top ones are confirmed by replay at
the point each rack's frontier chose (search/sensitivity_confirm.py, `--confirm K --frontier F`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rackserve.search import envelope as env_math
from rackserve.search.frontier import rack_mix, screen_all
from rackserve.search.rack import RackSpec, configurations
from rackserve.search.screen import TimingCache, screen_config
from rackserve.timing.optimizations import parse_optimizations
from rackserve.timing.precision import with_precision
from rackserve.timing.spec import SPEC_DIR, load_hardware, load_model, parse_hardware, parse_model
from rackserve.timing.speculative import with_drafts
from rackserve.timing.timing_model import TimingModel

STEPS = (0.75, 1.25)
X = "tps_user_e2e_p90"  # AgentX's headline: P90 E2E-normalized interactivity (the screen's key)
_LINE = re.compile(r"^(\s*)([A-Za-z_][\w]*):\s*([^#\n]*?)\s*#\s*(.*)$")


@dataclass(frozen=True)
class FreeParam:
    kind: str  # hardware | model
    path: tuple[str, ...]
    value: float
    comment: str

    @property
    def name(self) -> str:
        return f"{self.kind}.{'.'.join(self.path)}"


def free_parameters(kind: str, name: str) -> list[FreeParam]:
    """Numeric lines of a spec file whose source comment says FREE (nested keys by indentation; inline
    mappings such as `gemm_compute: {...}` are skipped)."""
    text = (SPEC_DIR / kind / f"{name}.yaml").read_text()
    stack: list[tuple[int, str]] = []
    out = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        key = line.strip().split(":", 1)[0]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        m = _LINE.match(line)
        if m and "FREE" in m.group(4):
            try:
                value = float(m.group(3))
            except ValueError:
                value = None
            if value:
                out.append(FreeParam(kind, (*[k for _, k in stack], m.group(2)), value, m.group(4).strip()))
        if not line.split("#", 1)[0].split(":", 1)[1].strip():  # `key:` opens a nested mapping
            stack.append((indent, key))
    return out


def _with(data: dict, path: tuple[str, ...], value: float) -> dict:
    """`data` (a spec's model_dump) with the value at `path` replaced; an integer field (SM count, tile
    rows, passes) takes the nearest integer, at least 1."""
    data = dict(data)
    head, *rest = path
    if rest:
        data[head] = _with(data[head], tuple(rest), value)
    else:
        data[head] = max(1, round(value)) if isinstance(data[head], int) else value
    return data


class PerturbedCache(TimingCache):
    """The screen's timing cache with one spec value changed."""

    def __init__(self, param: FreeParam | None, factor: float) -> None:
        super().__init__()
        self.param, self.factor = param, factor

    def get(self, scenario):
        section = scenario.config.timing
        key = section.model_dump_json()
        if key in self._models:
            return self._models[key]
        hw, model = load_hardware(section.hardware), load_model(section.model)
        p = self.param
        if p is not None and p.kind == "hardware":
            hw = parse_hardware(_with(hw.model_dump(), p.path, p.value * self.factor), p.name)
        if p is not None and p.kind == "model":
            model = parse_model(_with(model.model_dump(), p.path, p.value * self.factor), p.name)
        model = with_drafts(with_precision(model, section.expert_precision, section.attention_math), section.speculative.drafts)
        spec = section.speculative
        tm = TimingModel(hw, model, parse_optimizations(section.optimizations), section.target_block_tokens,
                         section.engram_placement, spec.acceptance_length)
        self._models[key] = tm
        return tm


def headline(rack: RackSpec, labels: list[str], cache: TimingCache, mix) -> dict:
    """Throughput per GPU at each target and the peak, on the envelope of the given configurations."""
    cfgs = {c.label: c for c in configurations(rack)}
    pts = []
    for label in labels:
        try:
            curve = screen_config(rack, cfgs[label], mix, cache)
        except ValueError:
            continue
        pts += [{**p, "label": label} for p in curve.points]
    env = env_math.envelope(pts, X)
    out = {f"at {t:g}": env_math.throughput_at(env, t, X) for t in rack.search.targets}
    out["peak"] = max((p["throughput_per_gpu"] for p in pts), default=None)
    return out


def envelope_labels(rack: RackSpec, mix) -> list[str]:
    curves, _ = screen_all(rack, mix)
    pts = [{**p, "label": label} for label, (_, curve) in curves.items() for p in curve]
    return sorted({p["label"] for p in env_math.envelope(pts, X)})


def sensitivity(rack: RackSpec, versus: RackSpec | None = None) -> dict:
    """sensitivity.json's document (module docstring)."""
    racks = [rack] + ([versus] if versus else [])
    setup = []
    for r in racks:
        mix = rack_mix(r)
        labels = envelope_labels(r, mix)
        setup.append((r, mix, labels, headline(r, labels, TimingCache(), mix)))
    rows = []
    for r, mix, labels, base in setup:
        hw, model = r.timing["hardware"], r.timing.get("model", "deepseek-v4.1-flash")
        for p in free_parameters("hardware", hw) + free_parameters("model", model):
            moved = {}
            for f in STEPS:
                got = headline(r, labels, PerturbedCache(p, f), mix)
                moved[f"{f:g}"] = {k: (None if not base[k] or got[k] is None else got[k] / base[k] - 1.0) for k in base}
            worst = max((abs(v) for m in moved.values() for v in m.values() if v is not None), default=0.0)
            rows.append({"rack": r.name, "param": p.name, "value": p.value, "source": p.comment,
                         "moves": moved, "max_abs_move": worst})
    rows.sort(key=lambda row: -row["max_abs_move"])
    doc = {"schema": "rackserve.sensitivity/1", "racks": [r.name for r in racks], "steps": list(STEPS),
           "base": {r.name: base for r, _, _, base in setup},
           "envelope_configs": {r.name: labels for r, _, labels, _ in setup}, "rows": rows,
           "method": __doc__.strip().splitlines()[0]}
    if versus:
        doc["ratio_base"] = _ratio(doc["base"][rack.name], doc["base"][versus.name])
    return doc


def _ratio(a: dict, b: dict) -> dict:
    return {k: (a[k] / b[k] if a.get(k) and b.get(k) else None) for k in a}


def markdown(doc: dict) -> str:
    lines = ["| rack | parameter | value | -25%: peak / targets | +25%: peak / targets | source |", "|---|---|---:|---|---|---|"]
    for row in doc["rows"]:
        cells = []
        for f in ("0.75", "1.25"):
            m = row["moves"][f]
            cells.append(" / ".join(f"{v:+.1%}" if v is not None else "-" for v in m.values()))
        lines.append(f"| {row['rack']} | `{row['param']}` | {row['value']:g} | {cells[0]} | {cells[1]} | "
                     f"{row['source'][:80]} |")
    return "\n".join(lines) + "\n"


def write(doc: dict, out: Path, confirmed_md: str = "") -> None:
    """sensitivity.json and sensitivity.md; `confirmed_md`: the replay confirmation's table
    (search/sensitivity_confirm.py markdown), when the document has one."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    (out / "sensitivity.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "sensitivity.md").write_text(
        f"# Sensitivity of {', '.join(doc['racks'])} to the files' FREE parameters\n\n"
        f"Generated by `rackserve sim sensitivity` ({doc['method']}). Moves are of throughput per GPU on the\n"
        f"screened envelope ({', '.join(doc['base'][doc['racks'][0]])}).\n\n" + markdown(doc)
        + (f"\n## Confirmed by replay\n\n{confirmed_md}" if confirmed_md else ""))
