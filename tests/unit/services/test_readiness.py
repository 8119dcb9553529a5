"""/ready's verdict (services/router/readiness.py): ready only when every part a request needs is
there, and otherwise it names each missing part."""

from __future__ import annotations

from services.router.readiness import Readiness


def _readiness(routable=("prefill", "decode"), connected=("prefill", "decode")) -> Readiness:
    r = Readiness(lambda role: role in routable, lambda role: role in connected)
    r.redis = True
    r.answered = {"prefill": True, "decode": True}
    return r


def test_ready_when_redis_both_services_their_channels_and_a_rank_of_each_role_are_there():
    assert _readiness().ready() and _readiness().waiting_for() == []


def test_not_ready_before_the_first_health_poll():
    fresh = Readiness(lambda role: True, lambda role: True)
    assert not fresh.ready()
    assert len(fresh.waiting_for()) == 3  # redis, prefill, decode


def test_each_missing_part_is_named():
    no_decode_rank = _readiness(routable=("prefill",))
    assert no_decode_rank.waiting_for() == ["decode: no decode rank is answering and in routing"]
    not_connected = _readiness(connected=("decode",))
    assert not_connected.waiting_for() == [
        "prefill: the router is not connected to the prefill service"
    ]
    silent = _readiness()
    silent.answered["decode"] = False
    assert silent.waiting_for() == ["decode: the decode service does not answer its health check"]
    no_redis = _readiness()
    no_redis.redis = False
    assert not no_redis.ready()
    assert no_redis.waiting_for() == ["redis: the KV-event stream is not reachable"]
