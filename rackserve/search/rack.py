"""A rack and its search space as data: the hardware, GPU count, model, optimizations and workload
of one rack, and the deployment knobs a search may turn (prefill and decode instances and their
layouts, decode batch cap, prefill chunk, MTP, routing policy).

`load_rack(path)` validates a rack YAML (errors name the field); `configurations(rack)` enumerates
the space, keeping each configuration that fits the rack's GPUs (`Config.gpus`); `scenario_of(rack,
config)` is the simulator scenario of one configuration, whose sizing (timing/capacity.py) decides
whether it fits in memory.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rackserve.sim.scenario import Scenario, scenario_from_dict

AGENTX_TARGETS = (387.0, 1000.0)  # tok/s/user targets the README reads the envelope at
FIXED_RANKS = {"dep2": 2, "tp8": 8}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PrefillChoice(_Model):
    """Prefill instances of one layout: dep2 (2 GPUs) or wide-ep with `ranks` (DEP4, DEP8...)."""

    layout: Literal["dep2", "wide-ep"]
    ranks: list[int] = Field(default_factory=list, description="wide-ep: GPUs per instance")
    counts: list[int] = Field(min_length=1, description="instance counts to try")

    @model_validator(mode="after")
    def _ranks(self) -> PrefillChoice:
        if self.layout == "wide-ep" and not self.ranks:
            raise ValueError("ranks: wide-ep needs at least one instance size")
        if any(c <= 0 for c in self.counts):
            raise ValueError("counts: must be positive")
        return self


class DecodeChoice(_Model):
    """Decode instances of one layout: wide-ep with `ranks` GPUs each, or tp8 (one rank of 8 GPUs)."""

    layout: Literal["wide-ep", "tp8"]
    ranks: list[int] = Field(default_factory=list, description="wide-ep: GPUs per instance")
    counts: list[int] = Field(min_length=1, description="instance counts to try")

    @model_validator(mode="after")
    def _ranks(self) -> DecodeChoice:
        if self.layout == "wide-ep" and not self.ranks:
            raise ValueError("ranks: wide-ep needs at least one instance size")
        if any(c <= 0 for c in self.counts):
            raise ValueError("counts: must be positive")
        return self


class Space(_Model):
    prefill: list[PrefillChoice] = Field(min_length=1)
    decode: list[DecodeChoice] = Field(min_length=1)
    decode_max_num_seqs: list[int] = Field([1024], min_length=1, description="vLLM max_num_seqs of decode ranks")
    max_num_batched_tokens: list[int] = Field(
        [8192], min_length=1, description="vLLM max_num_batched_tokens: the prefill chunk per rank and step")
    mtp: list[bool] = Field([True], min_length=1, description="speculative decoding by the draft layers")
    policies: list[str] = Field(["least-uncached-work"], min_length=1)


class SearchSettings(_Model):
    targets: list[float] = Field(list(AGENTX_TARGETS), description="tok/s/user targets")
    concurrency_low: int = Field(8, gt=0)
    concurrency_high: int = Field(16384, gt=0)
    window_s: float = Field(900.0, gt=0, description="measured window of a replay (AgentX: >= 900 s)")
    warmup_s: float = Field(60.0, ge=0, description="simulated time before the window, after the warm-up turns")


class RackSpec(_Model):
    name: str
    description: str = ""
    gpus: int = Field(gt=0, description="GPUs in the rack (NVL72: 72)")
    timing: dict[str, Any]
    sim: dict[str, Any] = Field(default_factory=dict)
    pool: dict[str, Any] = Field(default_factory=dict)
    workload: dict[str, Any]
    space: Space
    search: SearchSettings = SearchSettings()


@dataclass(frozen=True)
class Config:
    """One deployment of the space: what a frontier point is run with."""

    prefill_layout: str
    prefill_ranks: int  # GPUs per prefill instance
    prefill_count: int
    decode_layout: str
    decode_ranks: int  # GPUs per decode instance
    decode_count: int
    decode_max_num_seqs: int
    max_num_batched_tokens: int
    mtp: bool
    policy: str

    @property
    def gpus(self) -> int:
        return self.prefill_ranks * self.prefill_count + self.decode_ranks * self.decode_count

    @property
    def label(self) -> str:
        pre = f"{self.prefill_layout}x{self.prefill_count}" if self.prefill_layout == "dep2" else \
            f"dep{self.prefill_ranks}x{self.prefill_count}"
        dec = f"tp8x{self.decode_count}" if self.decode_layout == "tp8" else \
            f"wideep{self.decode_ranks}x{self.decode_count}"
        return (f"{pre}+{dec} seqs{self.decode_max_num_seqs} chunk{self.max_num_batched_tokens // 1024}k"
                f"{'' if self.mtp else ' nomtp'}{'' if self.policy == 'least-uncached-work' else ' ' + self.policy}")

    def to_dict(self) -> dict:
        return {**asdict(self), "gpus": self.gpus, "label": self.label}

    @staticmethod
    def from_dict(data: dict) -> Config:
        return Config(**{k: data[k] for k in Config.__dataclass_fields__})


def load_rack(path: str | Path) -> RackSpec:
    """Validate a rack file; ValueError names the file and the bad field."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: cannot read the rack file ({exc})") from None
    try:
        rack = RackSpec.model_validate(data)
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"{path}: {fields}") from None
    return rack


def _prefill_options(space: Space) -> list[tuple[str, int, int]]:
    out = []
    for choice in space.prefill:
        sizes = [FIXED_RANKS["dep2"]] if choice.layout == "dep2" else choice.ranks
        out += [(choice.layout, r, c) for r in sizes for c in choice.counts]
    return out


def _decode_options(space: Space) -> list[tuple[str, int, int]]:
    out = []
    for choice in space.decode:
        sizes = [FIXED_RANKS["tp8"]] if choice.layout == "tp8" else choice.ranks
        out += [(choice.layout, r, c) for r in sizes for c in choice.counts]
    return out


def configurations(rack: RackSpec) -> list[Config]:
    """Every configuration of the space that fits the rack's GPU count (memory fit is checked when
    the configuration is sized: screen.screen_config)."""
    s = rack.space
    out = []
    for pre, dec, seqs, chunk, mtp, policy in itertools.product(
            _prefill_options(s), _decode_options(s), s.decode_max_num_seqs, s.max_num_batched_tokens, s.mtp,
            s.policies):
        cfg = Config(*pre, *dec, seqs, chunk, mtp, policy)
        if cfg.gpus <= rack.gpus:
            out.append(cfg)
    return out


def _optimizations(base: str, mtp: bool) -> str:
    return f"{base},{'+' if mtp else '-'}mtp"


def scenario_of(rack: RackSpec, config: Config, concurrency: int = 1) -> Scenario:
    """The simulator scenario of `config` on `rack` at `concurrency` lanes, with the search's window."""
    pre: dict[str, Any] = {"layout": config.prefill_layout, "count": config.prefill_count}
    if config.prefill_layout == "wide-ep":
        pre["ranks"] = config.prefill_ranks
    dec: dict[str, Any] = {"layout": config.decode_layout, "count": config.decode_count}
    if config.decode_layout == "wide-ep":
        dec["ranks"] = config.decode_ranks
    timing = dict(rack.timing)
    timing["optimizations"] = _optimizations(str(timing.get("optimizations", "rubin-optimized")), config.mtp)
    sim = {**rack.sim, "max_num_batched_tokens": config.max_num_batched_tokens,
           "decode_max_batch_seqs": config.decode_max_num_seqs}
    wl = {**rack.workload, "concurrency": int(concurrency)}
    if wl.get("kind") == "agentx-trace":
        wl["measure_start_s"] = rack.search.warmup_s
        wl["duration_s"] = rack.search.warmup_s + rack.search.window_s
    data = {"name": f"{rack.name}:{config.label}", "timing": timing, "sim": sim, "workload": wl,
            "deployment": {"prefill": [pre], "decode": [dec]},
            "routing": {"policy": config.policy, "seed": 0}}
    if rack.pool:
        data["pool"] = dict(rack.pool)
    return scenario_from_dict(data, name=data["name"])
