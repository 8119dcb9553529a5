"""refine(): after the first replays, the next replays pin each target down on the *replayed*
curve (the screen's crossing is only where to start). Hand-computed cases on a synthetic screen
curve: lanes 10/20/40/80 at 1000/800/500/200 tok/s/user."""

from __future__ import annotations

import math

import pytest

from rackserve.search.plan import CLOSE, STEP, refine

X = "tps_user_e2e_p90"
CFG = {"label": "A", "gpus": 8}
SCREEN = [{"concurrency": n, X: v, "throughput_per_gpu": 100.0 * n, "requests_per_s": n / 10.0}
          for n, v in ((10, 1000.0), (20, 800.0), (40, 500.0), (80, 200.0))]
CURVES = {"A": (CFG, SCREEN)}


def replay(lanes: int, speed: float) -> dict:
    return {"config": CFG, "concurrency": lanes, X: speed, "throughput_per_gpu": 90.0 * lanes,
            "completed": 100, "valid": True, "source": "replay"}


def lanes_of(replays: list[dict], target: float = 387.0) -> list[int]:
    return [c.concurrency for c in refine(CURVES, replays, [target], X, 900.0)]


def test_too_slow_everywhere_moves_to_the_corrected_screen_crossing():
    # the replay at 40 lanes is 300 where the screen said 500: the screen's 387 means 387 x 500/300
    # = 645 on its own curve, crossed between 20 (800) and 40 (500) lanes at ~30 (linear in lanes)
    goal = 387 * 500 / 300
    expect = 20 + (800 - goal) / (800 - 500) * 20
    assert lanes_of([replay(40, 300.0)]) == [round(expect)]


def test_a_small_correction_still_moves_at_least_a_step():
    # the replay at 40 is 380, nearly the target: the corrected crossing (~39.6) is less than a step
    # away, so the next replay is 40 / STEP
    assert lanes_of([replay(40, 380.0)]) == [round(40 / STEP)]


def test_fast_everywhere_moves_to_more_lanes():
    # the replay beats the screen (900 vs 800): 387 means 387 x 800/900 = 344 on the screen, crossed
    # at ~61 lanes; a move is capped at STEP**3
    assert lanes_of([replay(20, 900.0)]) == [round(20 * STEP**3)]
    assert lanes_of([replay(20, 900.0)], target=850.0) == [round(20 * STEP)]  # at least a step (crossing ~23)


def test_a_wide_bracket_takes_the_log_lanes_secant():
    f = (450 - 387) / (450 - 300)
    expect = math.exp(math.log(20) + f * (math.log(40) - math.log(20)))
    assert lanes_of([replay(20, 450.0), replay(40, 300.0)]) == [round(expect)]


def test_a_close_bracket_is_done_and_an_unreachable_target_gives_up():
    close = int(20 * (1 + CLOSE))
    assert lanes_of([replay(20, 400.0), replay(close, 380.0)]) == []
    assert lanes_of([replay(1, 100.0)]) == []  # one lane is already too slow: nothing to try


def test_invalid_replays_do_not_count_and_run_points_are_not_proposed_again():
    bad = {**replay(20, 450.0), "valid": False}
    assert lanes_of([bad, replay(40, 300.0)]) == lanes_of([replay(40, 300.0)])
    first = lanes_of([replay(40, 300.0)])[0]
    again = lanes_of([replay(40, 300.0), replay(first, 300.0)])
    assert first not in again


@pytest.mark.parametrize("target", [387.0, 1000.0])
def test_each_target_is_refined_on_its_own(target):
    cands = refine(CURVES, [replay(20, 450.0), replay(40, 300.0)], [387.0, 1000.0], X, 900.0)
    whys = {c.why for c in cands}
    assert f"pins {target:g} (replay)" in whys


def test_two_replays_on_one_side_extrapolate_their_own_secant():
    # 115 lanes: 212, 88 lanes: 249 (both slower than 387): -138.6 per unit of log-lanes, so 387 lies
    # at 88 x exp(-138/138.6) ~ 32 lanes; a round moves at most STEP**3 (to 88 / 2.197 = 40)
    assert lanes_of([replay(115, 212.0), replay(88, 249.0)]) == [round(88 / STEP**3)]
    # a nearer target lands inside the caps: the secant itself (300 at ~61 lanes)
    slope = (249 - 212) / (math.log(88) - math.log(115))
    near = math.exp(math.log(88) + (300 - 249) / slope)
    assert lanes_of([replay(115, 212.0), replay(88, 249.0)], target=300.0) == [round(near)]


def test_a_secant_near_one_end_of_the_bracket_is_kept_a_quarter_inside():
    # 20 lanes at 400, 40 at 100 (a knee): the secant sits 4% into the bracket; the round goes a
    # quarter in (log-lanes), 20 x 2^0.25 ~ 24, so the bracket shrinks instead of creeping
    assert lanes_of([replay(20, 400.0), replay(40, 100.0)]) == [round(20 * 2**0.25)]
