"""A rank's KV events on their way to the Redis Stream, sent by one background thread.

The step hands over what its engine drained and returns; the pump numbers and publishes them in
order (one thread: FIFO), so a Redis round trip (or, with Redis hung, its timeout) is never part
of a step. While Redis is unreachable the rank keeps serving and the pump drops what it is given;
once Redis answers again it starts a new epoch with `cleared` (events it could not send are lost,
so the router forgets this rank's blocks rather than trust a view with holes).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import redis

from rackserve.kv.events import EventSequencer, KVEvent, Publisher
from services import kvevents

log = logging.getLogger(__name__)
REDIS_RETRY_S = 0.5  # while Redis is unreachable, publishing is retried at most this often


class EventPump:
    """Publishes one rank's events (`send`) on its own thread, in the order they were given."""

    def __init__(self, client: redis.Redis, publisher: Publisher) -> None:
        self.client = client
        self.publisher = publisher
        # The wire numbering of this rank's events: a new epoch per actor start (a restarted
        # actor counts from 1 again and the router's index follows it instead of ignoring it).
        self._events = EventSequencer(publisher, time.time_ns())
        self._unsent: list[KVEvent] = []
        self._retry_at = 0.0
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-events")

    def send(self, events: Sequence[KVEvent]) -> Future | None:
        """Queue a step's events (none: nothing to do, unless a retry is due)."""
        if not events and not self._retry_at:
            return None
        return self._thread.submit(self._publish, list(events))

    def flush(self) -> None:
        """Wait until everything sent so far was published (or dropped)."""
        self._thread.submit(lambda: None).result()

    def _publish(self, events: list[KVEvent]) -> None:
        if self._retry_at:
            if time.monotonic() < self._retry_at:
                return
            self._events.start_over(time.time_ns())
            self._unsent = [self._events.make("cleared", "rank_hbm")]
        self._unsent += [self._events.restamp(e) for e in events]
        if not self._unsent:
            return
        try:
            kvevents.publish(self.client, self._unsent)
        except redis.RedisError as exc:
            if not self._retry_at:
                p = self.publisher
                log.warning("%s/%d: KV events not published (%s)", p.instance, p.dp_rank, exc)
            self._retry_at = time.monotonic() + REDIS_RETRY_S
            return
        self._unsent, self._retry_at = [], 0.0
