"""docs/benchmarks.md is generated from the committed result files (bench/report.py, bench/catalog.py):
it is what they say now, and every result and script it names exists."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_report():
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "bench" / "report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    return report


def test_benchmarks_page_is_the_results() -> None:
    report = load_report()
    assert report.PAGE.read_text() == report.page(), "run: .venv/bin/python bench/report.py"


def test_every_result_and_script_the_catalog_names_exists() -> None:
    report = load_report()
    results = [r for p in report.PURPOSES for r in p.results]
    missing = [r.path for r in results if not (ROOT / r.path).exists()]
    scripts = {s for r in results for s in re.findall(r"bench/[\w/]+\.py", r.command)}
    missing += sorted(s for s in scripts if not (ROOT / s).exists())
    assert not missing, missing
