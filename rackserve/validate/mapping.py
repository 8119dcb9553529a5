"""Map a public point onto what the twin can run: hardware, model, expert precision, MTP, the prefill
and decode workers as layouts, the benchmark's lengths and load, and which check it is.

InferenceX rows say their workers as "N worker(s) x TPt/EPe, dp_attn=B" (TRT-LLM / SGLang terms: TP is
the worker's GPU count, EP its expert-parallel degree; dp_attn: attention data-parallel): dp_attn=True
is dep(t) with each expert split t / e ways, False is tep(t). Rows in prose (blog tables, phase
measurements) are read by data/public-points/layouts.yaml, each with the sentence it was read from.
Whatever the twin does differently from the row is listed in `approximations`; nothing is dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rackserve.timing.spec import load_hardware
from rackserve.validate.points import Point

DEFAULT_LAYOUTS = Path(__file__).resolve().parents[2] / "data/public-points/layouts.yaml"
KINDS = ("serving", "aggregated", "prefill-phase", "decode-at-speed", "decode-saturated", "single-stream",
         "unexpressed")
# InferenceX random dataset: --random-range-ratio 0.8, --num-prompts = 10 x concurrency (InferenceMAX README,
# "Benchmark Client Configuration"); throughput = all tokens / benchmark duration (utils/process_result.py).
LENGTH_SPREAD = 0.2
PROMPTS_PER_LANE = 10
MAX_REQUESTS = 40_000  # a simulated run's cap: past it the ramp and drain weigh more than the benchmark's
HARDWARE = (("GB300", "gb300"), ("GB200", "gb200"), ("B200", "b200"), ("H200", "h200"), ("H100", "h100"),
            ("H800", "h800"))
_WORKERS = re.compile(r"(\d+)\s*worker\(s\)\s*x\s*TP(\d+)/EP(\d+),\s*dp_attn=(True|False)")
_SINGLE = re.compile(r"single node TP(\d+)/EP(\d+),\s*dp_attn=(True|False)")


@dataclass(frozen=True)
class Workers:
    """`count` instances of one layout (rackserve/timing/layout.py) of `gpus` GPUs each."""

    layout: str  # dep | tep
    gpus: int
    count: int = 1
    moe_tp: int = 1

    @property
    def total_gpus(self) -> int:
        return self.gpus * self.count

    @property
    def gpus_per_rank(self) -> int:
        """GPUs of one data-parallel rank: all of a tep instance's, one of a dep's."""
        return self.gpus if self.layout == "tep" else 1

    @property
    def ranks(self) -> int:
        """Data-parallel ranks over all the instances."""
        return self.total_gpus // self.gpus_per_rank

    def as_group(self) -> dict:
        group = {"layout": self.layout, "ranks": self.gpus, "count": self.count}
        if self.moe_tp != 1:
            group["moe_tp"] = self.moe_tp
        return group

    def describe(self) -> str:
        split = f" (experts TP{self.moe_tp} x EP{self.gpus // self.moe_tp})" if self.moe_tp != 1 else ""
        return f"{self.count} x {self.layout}{self.gpus}{split}"


@dataclass(frozen=True)
class Mapped:
    """A row as the twin runs it: `kind` says which check (KINDS) and what its figures mean."""

    id: str
    kind: str
    hardware: str | None
    model: str | None
    expert_precision: str | None
    attention_math: str | None
    mtp: bool
    prefill: Workers | None
    decode: Workers | None
    isl: int | None
    osl: int | None
    concurrency: int | None
    context_tokens: int | None = None  # phase checks: the decode context or prefill prompt length
    decode_batch_per_rank: int | None = None  # decode-saturated: the batch the row ran at
    acceptance_length: float | None = None  # MTP tokens per step where the row's source states it
    decode_batch_cap: int | None = None  # per decode rank: the running batch the row's figures imply
    compare: tuple[str, ...] | None = None  # the figures the row can be compared on (None: all it has)
    tput_figure: str = "total"  # total | prefill-input-per-prefill-gpu | decode-output-per-decode-gpu | output-per-gpu
    approximations: tuple[str, ...] = field(default_factory=tuple)
    read_as: str = ""
    engine: dict = field(default_factory=dict)  # aggregated rows: the engine's sim settings (engine_settings)

    @property
    def gpus(self) -> int:
        """GPUs the row's throughput is divided by (an aggregated instance's once)."""
        if self.kind == "aggregated":
            return self.decode.total_gpus
        return sum(w.total_gpus for w in (self.prefill, self.decode) if w is not None)

    def describe(self) -> str:
        parts = []
        if self.prefill is not None and self.kind != "aggregated":
            parts.append(f"prefill {self.prefill.describe()}")
        if self.decode is not None:
            parts.append(("aggregated " if self.kind == "aggregated" else "decode ") + self.decode.describe())
        return ", ".join(parts)


def read_layouts(path: str | Path = DEFAULT_LAYOUTS) -> dict[str, dict]:
    """The readings of prose rows, by id (data/public-points/layouts.yaml)."""
    path = Path(path)
    if not path.is_file():
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: top level must map row ids to readings")
    return data


def map_point(p: Point, readings: dict[str, dict] | None = None, batch_caps: bool = True) -> Mapped:
    """The twin's form of row `p`. A prose row needs its reading in `readings`; a row with neither an
    InferenceX worker string nor a reading is `unexpressed`, saying why. `batch_caps`: cap each decode
    rank's batch at the running batch the row's own figures imply, where that is below its lanes."""
    reading = (readings or {}).get(p.id, {})
    approx: list[str] = list(reading.get("approximations", []))
    hardware = _hardware(p.hardware)
    model = _model(p.model)
    if hardware is None or model is None:
        why = f"no hardware spec for {p.hardware!r}" if hardware is None else f"no model spec for {p.model!r}"
        return _unexpressed(p, reading.get("why", why))
    if reading.get("kind") == "unexpressed":
        return _unexpressed(p, reading["why"])
    precision = _precision(p.precision, hardware, approx)
    attention_math = _attention_math(p.precision, hardware, precision, approx)
    mtp = bool(p.mtp)
    if p.mtp is None:
        approx.append("MTP use not stated by the source: run without MTP")
    prefill, decode, kind = _workers(p, reading)
    if kind is None:
        return _unexpressed(p, f"cannot read the workers from {p.prefill_cfg!r} / {p.decode_cfg!r}")
    if "BF16 attention" in p.precision or "BF16 MLA" in p.precision:
        approx.append("attention math in BF16 as the row runs it; attention projections priced in FP8 "
                      "(the model spec's dense format)")
    if p.tps_user_percentile and "median" not in p.tps_user_percentile and kind in ("serving", "aggregated"):
        approx.append(f"per-user speed compared as 1 / median TPOT; the row gives {p.tps_user_percentile!r}")
    if p.tput_definition and p.tput_definition.startswith("INFERRED"):
        approx.append(f"measured throughput is the source's inference: {p.tput_definition}")
    if kind == "serving" and p.concurrency and p.concurrency * PROMPTS_PER_LANE > MAX_REQUESTS:
        approx.append(f"{MAX_REQUESTS:,} requests simulated, not the benchmark's 10 x concurrency "
                      f"({p.concurrency * PROMPTS_PER_LANE:,}): its ramp and drain weigh a little more")
    cap = decode_batch_implied(p, decode) if (batch_caps and kind == "serving") else None
    if cap is not None and cap * decode.ranks >= p.concurrency:
        cap = None  # it would not bind
    if cap is not None:
        approx.append(f"decode batch capped at {cap} per rank: the running batch the row's own figures imply "
                      "(Little: output tok/s per decode GPU / tok/s per user); InferenceX configs fix a "
                      "max_batch_size the points do not carry")
    engine = engine_settings(p, decode, mtp, approx) if kind == "aggregated" else {}
    for side, w in (("prefill", prefill), ("decode", decode)):
        if w is not None and w.gpus > load_hardware(hardware).nvlink_domain_gpus and w.layout == "tep":
            approx.append(f"{side} tep{w.gpus} spans NVLink domains: its all-reduce priced as NVLink")
    return Mapped(
        p.id, kind, hardware, model, precision, attention_math, mtp, prefill, decode, p.isl, p.osl, p.concurrency,
        reading.get("context_tokens"), reading.get("decode_batch_per_rank"),
        reading.get("acceptance_length"), cap, tuple(reading["compare"]) if "compare" in reading else None,
        reading.get("tput_figure", "total"), tuple(approx),
        reading.get("read_as", ""), engine,
    )


def engine_settings(p: Point, w: Workers, mtp: bool, approx: list[str]) -> dict:
    """An aggregated row's engine as the benchmark launched it. TensorRT-LLM under attention DP, from
    InferenceX's scripts (benchmarks/dsr1_fp4_b200_trt.sh, dsr1_fp8_h200_trt_mtp.sh): attention_dp_config
    enable_balance with timeout_iters 60 (batching_wait_iters 0); max_num_tokens (the step's token budget)
    = the batch's decode tokens + ISL + 64 rounded up to 64 (at least 8192 without MTP); with MTP, one
    draft (num_nextn_predict_layers 1 under attention DP) and max_batch_size = concurrency / TP per rank.
    Other engines: their defaults (sim.max_num_batched_tokens 8192, no balance)."""
    if "TRT" not in p.framework.upper() or w.layout != "dep" or not p.isl or not p.concurrency:
        return {}
    per_rank = max(1, p.concurrency // w.ranks)
    if mtp:
        budget = ((1 + 1) * per_rank + p.isl + 64 + 63) // 64 * 64
        engine = {"max_num_batched_tokens": budget, "decode_max_batch_seqs": per_rank, "drafts": 1}
    else:
        budget = max(8192, (p.concurrency + p.isl + 64 + 63) // 64 * 64)
        engine = {"max_num_batched_tokens": budget}
    engine["adp_balance_timeout_iters"] = 60
    approx.append("TensorRT-LLM engine as InferenceX launches it: attention-DP balance (timeout_iters 60), "
                  f"max_num_tokens {budget}" + (f", MTP with 1 draft, max_batch_size {per_rank}" if mtp else ""))
    return engine


_OUT_PER_GPU = re.compile(r"output tok/s per decode GPU=([\d.]+)")


def decode_batch_implied(p: Point, decode: Workers | None) -> int | None:
    """Sequences each decode rank ran, by Little's law from the row's output tok/s per decode GPU (its
    notes) and tok/s per user; None where the row has not both."""
    found = _OUT_PER_GPU.search(p.notes or "")
    if not found or not p.tps_user or decode is None:
        return None
    return max(1, round(float(found[1]) * decode.gpus_per_rank / p.tps_user))


def _unexpressed(p: Point, why: str) -> Mapped:
    return Mapped(p.id, "unexpressed", _hardware(p.hardware), _model(p.model), None, None, False, None, None,
                  p.isl, p.osl, p.concurrency, approximations=(why,))


def _hardware(text: str) -> str | None:
    for key, name in HARDWARE:
        if key in text:
            return name
    return None


def _model(text: str) -> str | None:
    if "V4" in text:
        return None  # DeepSeek-V4-Pro: no spec (its config is not among the sources)
    if "R1" in text or "V3" in text:
        return "deepseek-v3"  # R1 and V3 share the V3 architecture (points README)
    return None


def _precision(text: str, hardware: str, approx: list[str]) -> str | None:
    if "FP4" not in text.upper():
        return None  # the V3 spec's own block-FP8 experts
    if hardware.startswith("h"):
        approx.append("FP4 experts on Hopper (no FP4 tensor cores): stored and computed as FP8")
    return "nvfp4"


def _attention_math(text: str, hardware: str, experts: str | None, approx: list[str]) -> str | None:
    """FP8 attention where the row says so, or where an NVFP4 checkpoint is served on Blackwell: its
    recipes keep an FP8 KV cache and run FP8 MLA (pub-33 and pub-35 state "FP8 attention" for NVFP4 R1)."""
    if "FP8 attention" in text:
        return "fp8"
    if experts == "nvfp4" and not hardware.startswith("h"):
        approx.append("attention math FP8 (FP8 KV cache) as NVFP4 R1 serving runs it (pub-33, pub-35); the row does not say")
        return "fp8"
    return None



def _workers(p: Point, reading: dict) -> tuple[Workers | None, Workers | None, str | None]:
    if "kind" in reading:
        pre = Workers(**reading["prefill"]) if reading.get("prefill") else None
        dec = Workers(**reading["decode"]) if reading.get("decode") else None
        return pre, dec, reading["kind"]
    single = _SINGLE.search(p.prefill_cfg)
    if p.disagg is False and single:
        tp, ep, dp_attn = int(single[1]), int(single[2]), single[3] == "True"
        w = _instance(1, tp, ep, dp_attn)
        return w, w, "aggregated"
    pre, dec = _WORKERS.search(p.prefill_cfg), _WORKERS.search(p.decode_cfg)
    if not (pre and dec):
        return None, None, None
    return (_instance(int(pre[1]), int(pre[2]), int(pre[3]), pre[4] == "True"),
            _instance(int(dec[1]), int(dec[2]), int(dec[3]), dec[4] == "True"), "serving")


def _instance(count: int, tp: int, ep: int, dp_attn: bool) -> Workers:
    moe_tp = max(1, tp // ep)
    return Workers("dep" if dp_attn else "tep", tp, count, moe_tp)
