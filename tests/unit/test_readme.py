"""The README stays a front door (issue 34): at most 250 lines, no prose line over 120 characters
(code blocks and tables aside), every link to a page that exists, the two set-up commands, and a
failure table that is bench/results/faults/chaos.json's, not hand-copied figures."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_LINES, MAX_PROSE = 250, 120


def prose_lines(text: str) -> list[tuple[int, str]]:
    out, code = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            code = not code
            continue
        if not code and not line.startswith("|"):
            out.append((n, line))
    return out


def local_links(path: Path) -> list[str]:
    targets = re.findall(r"\]\(([^)]+)\)", path.read_text())
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t) and t.split("#")[0]]


def test_readme_is_short() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_LINES
    long = [(n, len(line)) for n, line in prose_lines(text) if len(line) > MAX_PROSE]
    assert not long, f"prose lines over {MAX_PROSE} characters (line, length): {long}"


def test_every_link_of_the_readme_and_docs_exists() -> None:
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    missing = [(p.name, t) for p in pages for t in local_links(p) if not (p.parent / t).exists()]
    assert not missing, missing
    assert {t for t in local_links(README) if t.startswith("docs/")} >= {
        f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")
    }, "a docs page the README's map does not name"


def test_the_two_commands_and_the_generated_blocks_are_there() -> None:
    text = README.read_text()
    assert "make up" in text and "make test" in text
    assert text.index("<!-- frontier:begin -->") < text.index("<!-- frontier:end -->")


def test_failure_table_is_the_chaos_results() -> None:
    spec = importlib.util.spec_from_file_location("bench_chaos", ROOT / "bench" / "faults" / "chaos.py")
    chaos = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chaos)
    result = json.loads((ROOT / "bench" / "results" / "faults" / "chaos.json").read_text())
    block = README.read_text().split(chaos.BEGIN, 1)[1].split(chaos.END, 1)[0]
    assert block.strip() == chaos.render(result).strip(), "run: .venv/bin/python bench/faults/chaos.py --render"
