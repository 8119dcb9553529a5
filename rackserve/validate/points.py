"""Public measured serving points: one JSON object a line (data/public-points/README.md says what each
field means), read into typed rows; errors name the line and the field."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

DEFAULT_POINTS = Path(__file__).resolve().parents[2] / "data/public-points/points.jsonl"


class Point(BaseModel):
    """One published measurement, as its publisher reported it."""

    model_config = ConfigDict(extra="allow", frozen=True)

    id: str
    source: str = ""
    url: str = ""
    model: str
    hardware: str
    framework: str = ""
    precision: str = ""
    disagg: bool | None = None
    prefill_cfg: str = ""
    decode_cfg: str = ""
    mtp: bool | None = None
    isl: int | None = Field(None, gt=0)
    osl: int | None = Field(None, gt=0)
    workload: str = ""
    concurrency: int | None = Field(None, gt=0)
    tput_per_gpu: float | None = Field(None, gt=0)
    tput_definition: str | None = None
    tps_user: float | None = Field(None, gt=0)
    tps_user_percentile: str | None = None
    ttft_s: float | None = Field(None, gt=0)
    notes: str = ""


def read_points(path: str | Path = DEFAULT_POINTS) -> list[Point]:
    """Every row of a points file. ValueError names the file, line and field of a bad row."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror})") from None
    rows, seen = [], set()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from None
        try:
            row = Point.model_validate(data)
        except ValidationError as exc:
            where = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
            raise ValueError(f"{path}:{n}: {where}") from None
        if row.id in seen:
            raise ValueError(f"{path}:{n}: id {row.id!r} appears twice")
        seen.add(row.id)
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows
