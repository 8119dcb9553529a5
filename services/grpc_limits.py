"""Message-size limits every rackserve gRPC server (and its clients) sets explicitly.

Requests carry token ids and KV *handles* (block hashes), never KV bytes, so 4 MiB is ample; a
larger message is refused by gRPC itself with RESOURCE_EXHAUSTED before any handler runs.
"""

from __future__ import annotations

MAX_MESSAGE_BYTES = 4 * 1024 * 1024

SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]

# Clients of a service that may restart (the supervisor brings it back within seconds): gRPC's
# default reconnect backoff grows to 120 s, which would keep a channel failing long after the
# server is back; cap it so calls reach the restarted server within about a second.
RECONNECT_OPTIONS: list[tuple[str, int]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
