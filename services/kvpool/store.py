"""The pool service's Redis side: the epoch key, KV-event publishing and deletion of dropped blocks.

Events and deletions go out in order on one publisher thread, off the request path; a reservation
of a hash whose deletion is still queued waits for it. The epoch key holds a token of the running pool. If Redis restarts empty the token is gone: the
pool then forgets its metadata, publishes `cleared` and keeps serving (misses, not errors).
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid

import redis

from rackserve.kv.events import KVEvent
from services import kvevents
from services.kvpool.keys import block_glob, block_key, epoch_key

log = logging.getLogger(__name__)


class PoolStore:
    """What the pool service writes to Redis (never block bytes: clients move those)."""

    def __init__(self, client: redis.Redis, key_prefix: str, stream: str = kvevents.STREAM) -> None:
        self.client = client
        self.key_prefix = key_prefix
        self.stream = stream
        self.redis_ok = True
        self._token = ""
        self._queue: queue.Queue[tuple[list[KVEvent], list[int]] | None] = queue.Queue()
        self._dropping: set[int] = set()
        self._dropping_lock = threading.Lock()
        self._thread = threading.Thread(target=self._publish_loop, name="kvpool-publisher", daemon=True)
        self._thread.start()

    def claim(self) -> int:
        """Start a pool incarnation: delete block keys left by an earlier one, set a new token.
        Returns how many leftover block keys were deleted."""
        deleted = 0
        batch: list[bytes] = []
        for key in self.client.scan_iter(match=block_glob(self.key_prefix), count=1000):
            batch.append(key)
            if len(batch) == 1000:
                deleted += self.client.unlink(*batch)
                batch = []
        if batch:
            deleted += self.client.unlink(*batch)
        self._renew_token()
        return deleted

    def _renew_token(self) -> None:
        self._token = uuid.uuid4().hex
        self.client.set(epoch_key(self.key_prefix), self._token)

    def lost_epoch(self) -> bool:
        """True once if Redis no longer holds our token (it restarted empty); renews the token.
        Raises redis.RedisError while Redis is unreachable."""
        current = self.client.get(epoch_key(self.key_prefix))
        if current is not None and current.decode() == self._token:
            return False
        self._renew_token()
        return True

    def apply(self, events: list[KVEvent], dropped: list[int]) -> None:
        """Queue events and deletions of dropped blocks' bytes for the publisher thread (kept in
        order). A reservation of a hash still being deleted must call `settle` first."""
        if not events and not dropped:
            return
        with self._dropping_lock:
            self._dropping.update(dropped)
        self._queue.put((events, dropped))

    def settle(self, hashes: list[int]) -> None:
        """Wait until none of `hashes` is still queued for deletion (so new bytes survive)."""
        with self._dropping_lock:
            busy = not self._dropping.isdisjoint(hashes)
        if busy:
            self.flush()

    def flush(self) -> None:
        """Wait until every queued event is published and every dropped key deleted."""
        self._queue.join()

    def _publish_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self.redis_ok = self._publish(*item)
                with self._dropping_lock:
                    self._dropping.difference_update(item[1])
            finally:
                self._queue.task_done()

    def _publish(self, events: list[KVEvent], dropped: list[int]) -> bool:
        """One round trip; False if Redis failed (the events are then lost: their sequence numbers
        leave a gap the router detects; the keys are gone anyway if Redis restarted empty)."""
        pipe = self.client.pipeline(transaction=False)
        for event in events:
            pipe.xadd(self.stream, kvevents.encode(event), maxlen=kvevents.DEFAULT_MAXLEN, approximate=True)  # type: ignore[arg-type]
        if dropped:
            pipe.unlink(*(block_key(self.key_prefix, h) for h in dropped))
        try:
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("pool could not publish %d events / drop %d keys: %s", len(events), len(dropped), exc)
            return False
        return True

    def close(self) -> None:
        """Publish what is queued, then stop the publisher thread."""
        self._queue.put(None)
        self._thread.join(timeout=10.0)
