"""The envelope across configurations, read at a target and summed, on hand-computed cases."""

import math

import pytest

from rackserve.search.envelope import area, envelope, throughput_at, winner_at

X = "tps_user_p90"


def pt(cfg: str, tput: float, speed: float) -> dict:
    return {"config": {"label": cfg}, "throughput_per_gpu": tput, X: speed}


# two configurations: A is fast and light, B slow and heavy; A@300 is beaten by B@400 on both axes
A = [pt("A", 100, 1000), pt("A", 200, 800), pt("A", 300, 350)]
B = [pt("B", 400, 500), pt("B", 600, 200)]


def test_envelope_takes_non_dominated_points_across_configurations():
    env = envelope(A + B, X)
    assert [(p["config"]["label"], p["throughput_per_gpu"]) for p in env] == [
        ("B", 600), ("B", 400), ("A", 200), ("A", 100)]
    # a single configuration's own Pareto curve would keep A@300: across configurations it is dominated
    assert all(p["throughput_per_gpu"] != 300 for p in env)


def test_throughput_at_interpolates_between_neighbours_of_different_configurations():
    env = envelope(A + B, X)
    # between B@(400, 500) and A@(200, 800): at 650 halfway -> 300
    assert throughput_at(env, 650, X) == pytest.approx(300.0)
    win = winner_at(env, 650, X)
    assert win["throughput_per_gpu"] == pytest.approx(300.0)
    assert win["config"]["label"] == "A"  # the point that meets 650 tok/s/user is A's


def test_unreachable_target_is_none_never_the_peak():
    env = envelope(A + B, X)
    assert throughput_at(env, 1001, X) is None
    assert winner_at(env, 1001, X) is None


def test_target_slower_than_every_point_is_the_peak_which_meets_it():
    env = envelope(A + B, X)
    assert throughput_at(env, 100, X) == 600
    assert winner_at(env, 100, X)["config"]["label"] == "B"


def test_area_between_targets_is_the_trapezoid_sum_and_zero_past_the_fastest_point():
    env = envelope(A + B, X)
    # from 500 to 800: (400+200)/2*300 = 90,000; from 800 to 1000: (200+100)/2*200 = 30,000
    assert area(env, 500, 1000, X) == pytest.approx(120_000)
    # past 1000 nothing is reached: the area to 1200 is the same
    assert area(env, 500, 1200, X) == pytest.approx(120_000)
    assert area(env, 200, 500, X) == pytest.approx((600 + 400) / 2 * 300)


def test_points_without_a_finite_speed_are_left_out():
    env = envelope([pt("A", 100, math.nan), pt("B", 50, 10)], X)
    assert [p["config"]["label"] for p in env] == ["B"]
