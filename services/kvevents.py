"""KV events on a Redis Stream: publishers (pool, rank caches) append, the router reads and replays.

Stream `rackserve:kv-events`; one entry per `KVEvent` with string fields:
  kind      "stored" | "removed" | "cleared"
  instance  publisher instance, e.g. "pool", "prefill-0"
  dp_rank   publisher DP rank (decimal)
  seq       per-publisher sequence number, 1, 2, 3, ... (decimal)
  tier      "rank_hbm" | "pool_hbm" | "pool_dram"
  parent    hash preceding the first listed block (decimal), "" = chain root
  hashes    block hashes, packed little-endian uint64 (8 bytes each; empty for cleared)
  epoch     the publisher's incarnation (decimal; absent = 0): a larger one restarts its seq at 1
A reader resumes after any stream id ("0-0" replays everything kept) and tracks each publisher's
last seq, so a gap (a missed or trimmed event) is reported instead of silently trusted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import redis

from rackserve.kv.events import KVEvent, Publisher

STREAM = "rackserve:kv-events"
DEFAULT_MAXLEN = 1_000_000  # approximate trim: the router replays at most this many events
_U64_LE = np.dtype("<u8")


def encode(event: KVEvent) -> dict[str, bytes | str]:
    return {
        "kind": event.kind,
        "instance": event.publisher.instance,
        "dp_rank": str(event.publisher.dp_rank),
        "seq": str(event.seq),
        "tier": event.tier,
        "parent": "" if event.parent_hash is None else str(event.parent_hash),
        "hashes": np.asarray(event.block_hashes, dtype=_U64_LE).tobytes(),
        "epoch": str(event.epoch),
    }


def decode(fields: dict[bytes, bytes]) -> KVEvent:
    parent = fields[b"parent"]
    hashes = np.frombuffer(fields[b"hashes"], dtype=_U64_LE)
    return KVEvent(
        kind=fields[b"kind"].decode(),  # type: ignore[arg-type]
        publisher=Publisher(fields[b"instance"].decode(), int(fields[b"dp_rank"])),
        seq=int(fields[b"seq"]),
        tier=fields[b"tier"].decode(),  # type: ignore[arg-type]
        block_hashes=tuple(int(h) for h in hashes),
        parent_hash=int(parent) if parent else None,
        epoch=int(fields.get(b"epoch", b"0")),
    )


def publish(client: redis.Redis, events: Iterable[KVEvent], stream: str = STREAM,
            maxlen: int | None = DEFAULT_MAXLEN) -> list[str]:
    """Append events in order (one pipelined round trip). Returns their stream ids."""
    pipe = client.pipeline(transaction=False)
    count = 0
    for event in events:
        pipe.xadd(stream, encode(event), maxlen=maxlen, approximate=True)  # type: ignore[arg-type]
        count += 1
    if count == 0:
        return []
    return [i.decode() if isinstance(i, bytes) else i for i in pipe.execute()]


def _entries(reply: list) -> list[tuple[str, KVEvent]]:
    out = []
    for _stream, entries in reply or []:
        for entry_id, fields in entries:
            out.append((entry_id.decode() if isinstance(entry_id, bytes) else entry_id, decode(fields)))
    return out


def read(client: redis.Redis, after_id: str = "0-0", count: int | None = None,
         block_ms: int | None = None, stream: str = STREAM) -> list[tuple[str, KVEvent]]:
    """Events after `after_id` ("0-0" = from the start, "$" = only new ones) as (id, event)."""
    return _entries(client.xread({stream: after_id}, count=count, block=block_ms))


@dataclass(frozen=True)
class Gap:
    publisher: Publisher
    expected_seq: int
    got_seq: int


@dataclass
class KVEventReader:
    """Follows the stream from `last_id`, checking each publisher's sequence numbers.

    After `read_batch`, `gaps` lists every jump (expected seq n, got m != n); a consumer that sees
    one should rebuild that publisher's view. A larger epoch, or seq 1 again, is a publisher
    restart, not a gap (a restarted publisher starts with `cleared` events); events of an older
    epoch than the one followed are left out.
    """

    client: redis.Redis
    last_id: str = "0-0"
    stream: str = STREAM
    last_seq: dict[Publisher, int] = field(default_factory=dict)
    gaps: list[Gap] = field(default_factory=list)
    epochs: dict[Publisher, int] = field(default_factory=dict)

    def read_batch(self, count: int | None = 1000, block_ms: int | None = None) -> list[KVEvent]:
        batch = read(self.client, self.last_id, count, block_ms, self.stream)
        events = []
        for entry_id, event in batch:
            self.last_id = entry_id
            if self._check(event):
                events.append(event)
        return events

    def _check(self, event: KVEvent) -> bool:
        epoch = self.epochs.setdefault(event.publisher, event.epoch)
        if event.epoch < epoch:
            return False
        if event.epoch > epoch:
            self.epochs[event.publisher] = event.epoch
            self.last_seq.pop(event.publisher, None)
        expected = self.last_seq.get(event.publisher, 0) + 1
        if event.seq != expected and not (event.seq == 1 and expected > 1):
            self.gaps.append(Gap(event.publisher, expected, event.seq))
        self.last_seq[event.publisher] = event.seq
        return True
