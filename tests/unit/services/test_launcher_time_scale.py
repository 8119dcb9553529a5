"""`rackserve up --time-scale`: a number passes through to the children's env override."""

from __future__ import annotations

from services.launcher import _time_scale, parse_args


def test_number_passes_through() -> None:
    assert _time_scale(parse_args(["--time-scale", "2.5"])) == "2.5"


def test_default_is_the_config() -> None:
    assert parse_args([]).time_scale is None
