"""The built-in routing policies; each registers itself with rackserve.routing.policy on import.

Imported by rackserve/routing/__init__.py, so `make_policy(name)` sees them all; the registry
imports none of them (a policy depends on the registry, never the other way round).
"""

from rackserve.routing.policies import (  # noqa: F401
    dynamo_kv,
    least_loaded,
    least_uncached,
    prefix_hash,
    random_choice,
    round_robin,
)
