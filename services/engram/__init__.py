"""Sharded Engram tables: shard.py (one shard's rows over gRPC), client.py (ShardedEngramTable, the
cluster's `EngramTable`), spawn.py (start N shard processes), __main__.py (`python -m services.engram`).
"""
