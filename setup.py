"""The compiled parts: the simulator's rank-cache LRU set (rackserve/sim/_lruset.c), a replayed
request's block ids (rackserve/workload/_blockids.c), the pool's stored-block record and leading-run bisection
(rackserve/kv/_poolcore.c) and the step pricer's roofline and token-bundle kernels (rackserve/timing/_pricer.c).
Everything else about the package is in pyproject.toml. `optional`: without a C compiler the install goes on and the
Python twins run (lru_set.py's PyLruSet, trace_blocks.py's numpy path, pool_chains.py's PyStoredBlock,
step_plan.py's numpy kernels and step_cost.py's token bundles: same results, slower; the pricer's to rounding,
see timing/pricer.py and timing/bundle_plan.py)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("rackserve.sim._lruset", ["rackserve/sim/_lruset.c"], depends=["rackserve/splitmix.h"],
                  extra_compile_args=["-O2"], optional=True),
        Extension("rackserve.workload._blockids", ["rackserve/workload/_blockids.c"], depends=["rackserve/splitmix.h"],
                  extra_compile_args=["-O2"], optional=True),
        Extension("rackserve.kv._poolcore", ["rackserve/kv/_poolcore.c"], extra_compile_args=["-O2"], optional=True),
        # no fused multiply-add: the element-wise arithmetic rounds as numpy's does
        Extension("rackserve.timing._pricer", ["rackserve/timing/_pricer.c"],
                  extra_compile_args=["-O2", "-ffp-contract=off"], optional=True),
    ],
)
