"""The pool service's Redis side: the epoch key, KV-event publishing and deletion of dropped blocks.

The epoch key holds a token of the running pool. If Redis restarts empty the token is gone: the
pool then forgets its metadata, publishes `cleared` and keeps serving (misses, not errors).
"""

from __future__ import annotations

import logging
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
        self._token = ""

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

    def apply(self, events: list[KVEvent], dropped: list[int]) -> bool:
        """Publish events and delete dropped blocks' bytes, in one round trip. False if Redis failed
        (the events are then lost: their sequence numbers leave a gap the router detects)."""
        if not events and not dropped:
            return True
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

    def delete_orphans(self, hashes: list[int]) -> None:
        """Delete bytes written for reservations that expired before commit."""
        if hashes:
            try:
                self.client.unlink(*(block_key(self.key_prefix, h) for h in hashes))
            except redis.RedisError as exc:
                log.warning("pool could not delete %d orphan keys: %s", len(hashes), exc)
