"""The rack KV pool (Mooncake-style): metadata in this service, block bytes in Redis.

server.py (gRPC handlers over rackserve.kv.pool_tiers), store.py (the service's Redis side: epoch,
events, deletions), client.py (PoolClient: bytes straight to/from Redis), metrics.py (Prometheus),
validate.py (INVALID_ARGUMENT checks), keys.py (Redis key layout), spawn.py (run it as a process),
__main__.py (`python -m services.kvpool ...`).
"""
