"""Network services that put the rackserve core on the wire (gRPC, HTTP, Redis, Ray)."""

from services.proto_build import ensure_built as _ensure_built

_ensure_built()
