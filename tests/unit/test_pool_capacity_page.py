"""docs/pool-capacity.md is generated from the committed sweep result (bench/pool/capacity_sweep.py
--render): it says what the result file says now, row for row, and its plot exists."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "bench" / "results" / "pool" / "capacity_sweep.json"
PAGE = ROOT / "docs" / "pool-capacity.md"


def _render():
    sys.path.insert(0, str(ROOT))
    from bench.pool.capacity_render import page, table

    return page, table


def test_the_page_is_the_result_file() -> None:
    page, _ = _render()
    doc = json.loads(RESULT.read_text())
    assert PAGE.read_text() == page(doc, "../bench/results/pool/capacity_sweep.png"), (
        "run: .venv/bin/python bench/pool/capacity_sweep.py --render")
    assert (ROOT / "bench" / "results" / "pool" / "capacity_sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_every_run_is_a_row_of_the_table() -> None:
    _, table = _render()
    doc = json.loads(RESULT.read_text())
    lines = table(doc["rows"]).splitlines()
    assert len(lines) == 2 + len(doc["rows"])
    for r in doc["rows"]:
        assert any(f"| {r['lanes']:,} | {r['capacity']} (" in ln and f"| {r['policy']} | {r['completed']:,} |" in ln
                   for ln in lines), r["capacity"]
