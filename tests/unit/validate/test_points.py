"""rackserve/validate/points.py: the project's copy of the public points reads, bad files say where."""

from __future__ import annotations

import json

import pytest

from rackserve.validate.points import DEFAULT_POINTS, read_points


def test_the_projects_copy_reads_with_every_source():
    rows = read_points(DEFAULT_POINTS)
    assert len(rows) == 23
    assert all(r.url and r.source for r in rows)
    assert {r.id for r in rows} >= {"pub-00", "pub-20", "pub-36", "pub-39"}


def test_a_bad_row_names_its_line_and_field(tmp_path):
    good = json.loads(DEFAULT_POINTS.read_text().splitlines()[0])
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "id": "x", "concurrency": -3}) + "\n")
    with pytest.raises(ValueError, match=r"p.jsonl:2: concurrency"):
        read_points(path)
    path.write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(ValueError, match=r":2: not JSON"):
        read_points(path)
    path.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(ValueError, match="appears twice"):
        read_points(path)
    with pytest.raises(ValueError, match="cannot read"):
        read_points(tmp_path / "missing.jsonl")
