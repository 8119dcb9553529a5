"""The simulator runs with rare full collections and gives the collector's thresholds back."""

from __future__ import annotations

import gc

from rackserve.sim.gc_policy import FULL_EVERY, rare_full_collections


def test_thresholds_inside_and_restored_after() -> None:
    before = gc.get_threshold()
    seen = rare_full_collections(gc.get_threshold)()
    assert seen == (before[0], before[1], max(before[2], FULL_EVERY))
    assert gc.get_threshold() == before


def test_restored_when_the_run_raises() -> None:
    before = gc.get_threshold()

    def boom() -> None:
        raise ValueError("boom")

    try:
        rare_full_collections(boom)()
    except ValueError:
        pass
    assert gc.get_threshold() == before
