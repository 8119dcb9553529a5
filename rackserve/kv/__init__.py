"""Paged KV: block hashing, per-rank block cache, serialization of a block's KV."""
